"""The agent's durable state in SQLite: credentials, trust, highest versions seen, and the report outbox.

A run is written to the outbox as 'running' before it starts and as 'done' when it ends; a restart turns
any 'running' row into a failure ('interrupted'), so every run that began produces exactly one report,
and the server ignores resent report ids, so a report sent twice counts once.

A task version whose runs were interrupted `QUARANTINE_AFTER` times in a row (the agent died during each,
whatever killed it) is quarantined: reported once and never run again on this device; a newer version is
not affected. So a task cannot hold the agent in a crash loop: each death during its run is counted
before the run starts again, and the count survives the restart. Text a task produced (its error) is made
storable and sendable (`safe_text`) before it reaches SQLite or the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS seen (task TEXT PRIMARY KEY, version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS outbox (
    id TEXT PRIMARY KEY, task TEXT NOT NULL, version INTEGER NOT NULL, state TEXT NOT NULL,
    outcome TEXT, latency_ms REAL, error TEXT, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS ix_outbox_state ON outbox (state);
CREATE TABLE IF NOT EXISTS quarantine (task TEXT NOT NULL, version INTEGER NOT NULL, reason TEXT NOT NULL,
    PRIMARY KEY (task, version));
"""
QUARANTINE_AFTER = 2  # consecutive interrupted runs of one version; one alone may be a power loss
ERROR_CHARS = 2000
_UNSAFE = re.compile("[\ud800-\udfff\x00]")


def safe_text(text: str, limit: int = ERROR_CHARS) -> str:
    """`text` cut to `limit` characters, with lone surrogates (which UTF-8, SQLite and the server's JSON
    cannot carry) and NUL (which PostgreSQL text refuses) replaced by U+FFFD."""
    return _UNSAFE.sub("\ufffd", text[:limit])



def _private(path: Path) -> None:
    """Make `path` (and SQLite's -wal/-shm beside it, which copy its mode when made) readable by us alone."""
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p.exists():
            os.chmod(p, 0o600)


class AgentState:
    """agent.db holds the device token and the trusted root: mode 0600, in a state folder of mode 0711."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        _private(path)
        self.db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._lock = threading.RLock()
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a report acknowledged to the caller survives power loss
        self.db.executescript(_SCHEMA)

    def close(self) -> None:
        self.db.close()

    # One connection shared by the agent's threads (its loop and its runs): every statement takes the lock,
    # and a transaction holds it from BEGIN to COMMIT, so no other thread's statement lands inside it.
    def _sql(self, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            return self.db.execute(sql, params).fetchall()

    def _one(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        rows = self._sql(sql, params)
        return rows[0] if rows else None

    def _many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        with self._lock:
            self.db.executemany(sql, rows)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """All or nothing (the connection autocommits each statement otherwise)."""
        with self._lock:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                yield
            except BaseException:
                self.db.execute("ROLLBACK")
                raise
            self.db.execute("COMMIT")

    # ---- key/value ----------------------------------------------------------------------------------
    def get(self, key: str, default: str | None = None) -> str | None:
        row = self._one("SELECT value FROM meta WHERE key = ?", (key,))
        return row[0] if row else default

    def put(self, key: str, value: str) -> None:
        self._sql("INSERT INTO meta (key, value) VALUES (?, ?) "
                  "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (key, value))

    def get_json(self, key: str) -> Any:
        raw = self.get(key)
        return json.loads(raw) if raw is not None else None

    def put_json(self, key: str, value: Any) -> None:
        self.put(key, json.dumps(value))

    def raise_int(self, key: str, value: int) -> None:
        """Monotonic counters (assignment serial): only ever go up."""
        if value > int(self.get(key, "0") or 0):
            self.put(key, str(value))

    # ---- highest versions seen (anti-rollback) -----------------------------------------------------
    def seen_version(self, task: str) -> int:
        row = self._one("SELECT version FROM seen WHERE task = ?", (task,))
        return int(row[0]) if row else 0

    def raise_seen(self, task: str, version: int) -> None:
        self._sql("INSERT INTO seen (task, version) VALUES (?, ?) ON CONFLICT(task) DO UPDATE "
                  "SET version = MAX(version, excluded.version)", (task, version))

    def reset_seen(self) -> None:
        """Forget every version floor (the release key rotated: what the old key signed no longer verifies)."""
        self._sql("DELETE FROM seen")

    # ---- report outbox ------------------------------------------------------------------------------
    def begin_run(self, task: str, version: int) -> str:
        run_id = uuid.uuid4().hex
        self._sql("INSERT INTO outbox (id, task, version, state, created) VALUES (?, ?, ?, 'running', ?)",
                  (run_id, task, version, time.time()))
        return run_id

    def finish_run(self, run_id: str, outcome: str, latency_ms: float, error: str) -> None:
        with self._transaction():
            self._sql("UPDATE outbox SET state = 'done', outcome = ?, latency_ms = ?, error = ? WHERE id = ?",
                      (outcome, latency_ms, safe_text(error), run_id))
            self._sql("DELETE FROM meta WHERE key = (SELECT 'interrupted:' || task || ':' || version "
                      "FROM outbox WHERE id = ?)", (run_id,))

    def report_refusal(self, task: str, version: int, error: str, kind: str = "refused") -> None:
        """One failure report for a signed version this device refuses to run (same id on every retry)."""
        run_id = hashlib.sha256(f"{kind}:{task}:{version}".encode()).hexdigest()[:32]
        self._sql("INSERT OR IGNORE INTO outbox (id, task, version, state, outcome, latency_ms, error, created) "
                  "VALUES (?, ?, ?, 'done', 'failure', 0, ?, ?)",
                  (run_id, task, version, safe_text(error), time.time()))

    def recover_interrupted_runs(self) -> list[tuple[str, int]]:
        """Turn runs the agent died during into crash reports, count them per version, and quarantine a
        version interrupted `QUARANTINE_AFTER` times in a row; returns the versions quarantined now."""
        quarantined = []
        with self._transaction():
            rows = self._sql("SELECT task, version FROM outbox WHERE state = 'running'")
            self._sql("UPDATE outbox SET state = 'done', outcome = 'crash', latency_ms = 0, "
                      "error = 'interrupted: the agent stopped during the run' WHERE state = 'running'")
            for task, version in rows:
                key = f"interrupted:{task}:{version}"
                count = int(self.get(key, "0") or 0) + 1
                self.put(key, str(count))
                if count >= QUARANTINE_AFTER and not self.quarantined(task, version):
                    self._quarantine(task, version, f"the agent stopped during {count} runs in a row")
                    quarantined.append((task, int(version)))
        return quarantined

    # ---- quarantine: versions this device will not run again ------------------------------------------
    def quarantine(self, task: str, version: int, reason: str) -> None:
        """Never run this version again here, and say so once in a failure report (the rollout sees it)."""
        with self._transaction():
            self._quarantine(task, version, reason)

    def _quarantine(self, task: str, version: int, reason: str) -> None:
        self._sql("INSERT OR IGNORE INTO quarantine (task, version, reason) VALUES (?, ?, ?)",
                  (task, version, safe_text(reason)))
        self.report_refusal(task, version, f"quarantined: {reason}", kind="quarantined")

    def quarantined(self, task: str, version: int) -> str | None:
        """The reason this version is quarantined, or None."""
        row = self._one("SELECT reason FROM quarantine WHERE task = ? AND version = ?",
                        (task, version))
        return str(row[0]) if row else None

    def pending_reports(self, limit: int = 500) -> list[dict[str, Any]]:
        rows = self._sql("SELECT id, task, version, outcome, latency_ms, error FROM outbox "
                         "WHERE state = 'done' ORDER BY created LIMIT ?", (limit,))
        return [{"id": r[0], "task": r[1], "version": r[2], "outcome": r[3], "latency_ms": r[4] or 0.0,
                 "error": r[5] or ""} for r in rows]

    def mark_sent(self, ids: list[str]) -> None:
        self._many("UPDATE outbox SET state = 'sent' WHERE id = ?", [(i,) for i in ids])

    def count(self, state: str) -> int:
        return int(self._one("SELECT COUNT(*) FROM outbox WHERE state = ?", (state,))[0])
