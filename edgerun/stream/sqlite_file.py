"""Opening the pipeline's SQLite files so that a corrupt file never stops the device.

Segment's Android tracker crashed on every start once its queue file was corrupt (analytics-android #794).
Here a file that is not a database, or fails `PRAGMA quick_check`, is renamed aside, whatever rows can still
be read are salvaged into a fresh file, and the caller gets a working connection and a count of both.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Copies rows from the quarantined connection into the fresh one; returns how many it saved.
Salvage = Callable[[sqlite3.Connection, sqlite3.Connection], int]


@dataclass
class OpenedDatabase:
    connection: sqlite3.Connection
    recovered_from: Path | None = None  # where the corrupt file was moved, if it was
    salvaged_rows: int = 0


def connect(path: Path) -> sqlite3.Connection:
    """WAL with synchronous=NORMAL: a committed transaction survives the process being killed (the WAL is
    in the page cache of the OS); only a power cut can lose the last ones, the trade-off of every phone app."""
    connection = sqlite3.connect(path, isolation_level=None, timeout=10.0, check_same_thread=False)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    connection.execute("PRAGMA busy_timeout=10000")
    return connection


class _QuickCheckFailed(sqlite3.DatabaseError):
    pass


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    """Only these say the file itself is bad: "locked", "busy", "read-only" or "disk full" must never get a
    healthy file quarantined."""
    code = (getattr(exc, "sqlite_errorname", None) or "").split("_(")[0]
    return isinstance(exc, _QuickCheckFailed) or code in ("SQLITE_CORRUPT", "SQLITE_NOTADB")


def open_database(path: Path, schema: str, salvage: Salvage) -> OpenedDatabase:
    """Opens (creating if needed) the database at `path` with `schema` applied, recovering a corrupt file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    connection: sqlite3.Connection | None = None
    try:
        connection = connect(path)
        result = connection.execute("PRAGMA quick_check").fetchone()[0]
        if result != "ok":
            raise _QuickCheckFailed(result)
        connection.executescript(schema)
        return OpenedDatabase(connection)
    except sqlite3.DatabaseError as exc:
        if connection is not None:
            connection.close()
        if not _is_corruption(exc):
            raise
    quarantined = path.with_name(f"{path.name}.corrupt-{time.time_ns() // 1_000_000}")
    path.rename(quarantined)
    for suffix in ("-wal", "-shm"):
        sidecar = path.with_name(path.name + suffix)
        if sidecar.exists():
            sidecar.rename(quarantined.with_name(quarantined.name + suffix))
    fresh = connect(path)
    fresh.executescript(schema)
    saved = 0
    with contextlib.suppress(sqlite3.Error):
        old = sqlite3.connect(f"file:{quarantined}?mode=ro", uri=True, isolation_level=None)
        try:
            saved = salvage(old, fresh)
        finally:
            old.close()
    return OpenedDatabase(fresh, quarantined, saved)


def salvage_rows(old: sqlite3.Connection, fresh: sqlite3.Connection, select: str, insert: str) -> int:
    """Copies rows one by one until the corrupt file stops answering; returns how many were copied."""
    saved = 0
    fresh.execute("BEGIN IMMEDIATE")
    try:
        cursor = old.execute(select)
        while True:
            try:
                row = cursor.fetchone()
            except sqlite3.Error:
                break
            if row is None:
                break
            fresh.execute(insert, row)
            saved += 1
    except sqlite3.Error:
        pass  # the table itself is unreadable: nothing more to save
    fresh.execute("COMMIT")
    return saved
