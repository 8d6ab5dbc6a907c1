"""Collective storage (Walle §5.1): task outputs in SQLite (WAL), readable by other tasks, uploaded from there.

Outputs are small and frequent, so writes are buffered in memory and written in one transaction at a
threshold, on any read (read-your-writes) and on flush(). The same table is the upload buffer: bounded,
with an explicit drop policy whose every drop is counted.
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgerun.errors import EdgerunError
from edgerun.stream.events import now_ms
from edgerun.stream.sqlite_file import open_database, salvage_rows

DROP_OLDEST = "drop_oldest"  # the default: a fresh feature is worth more than a stale one
DROP_NEWEST = "drop_newest"

PENDING, UPLOADED, REJECTED = 0, 1, 2

COUNTERS = ("stored", "duplicates_ignored", "dropped_oldest", "dropped_newest", "uploaded", "upload_batches",
            "upload_retries", "upload_rejected", "corrupt_recoveries", "salvaged_records")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outputs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    record_id TEXT NOT NULL UNIQUE,
    task_id TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    payload TEXT NOT NULL,
    state INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outputs_by_state ON outputs (state, seq);
CREATE INDEX IF NOT EXISTS outputs_by_task ON outputs (task_id, created_ms);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


@dataclass(frozen=True)
class StoredRecord:
    seq: int
    record_id: str
    task_id: str
    created_ms: int
    payload: dict[str, Any]

    def to_wire(self) -> dict[str, Any]:
        return {"record_id": self.record_id, "task_id": self.task_id, "created_ms": self.created_ms,
                "payload": self.payload}


def _salvage(old: sqlite3.Connection, fresh: sqlite3.Connection) -> int:
    salvage_rows(old, fresh, "SELECT name, value FROM counters",
                 "INSERT OR REPLACE INTO counters (name, value) VALUES (?, ?)")
    return salvage_rows(old, fresh, "SELECT record_id, task_id, created_ms, payload, state FROM outputs ORDER BY seq",
                        "INSERT OR IGNORE INTO outputs (record_id, task_id, created_ms, payload, state) "
                        "VALUES (?, ?, ?, ?, ?)")


class CollectiveStore:
    """Task outputs on the device. Not thread-safe: the pipeline owns it and calls it from one thread."""

    def __init__(self, path: Path, *, flush_threshold: int = 32, max_pending: int = 50_000,
                 max_retained: int = 50_000, drop_policy: str = DROP_OLDEST) -> None:
        if drop_policy not in (DROP_OLDEST, DROP_NEWEST):
            raise EdgerunError(f"drop policy must be {DROP_OLDEST!r} or {DROP_NEWEST!r}, got {drop_policy!r}")
        if max_pending < 1 or flush_threshold < 1:
            raise EdgerunError("max_pending and flush_threshold must be at least 1")
        self.path = Path(path)
        self.flush_threshold = flush_threshold
        self.max_pending = max_pending
        self.max_retained = max_retained
        self.drop_policy = drop_policy
        opened = open_database(self.path, _SCHEMA, _salvage)
        self._db = opened.connection
        self.recovered_from = opened.recovered_from
        self._buffer: list[tuple[str, str, int, str]] = []
        if opened.recovered_from is not None:
            self._bump({"corrupt_recoveries": 1, "salvaged_records": opened.salvaged_rows})

    # -- writing -------------------------------------------------------------------------------------------

    def put(self, task_id: str, payload: dict[str, Any], *, record_id: str | None = None,
            created_ms: int | None = None) -> str:
        """Buffers one output; durable after the next flush (at the threshold, a read, or flush())."""
        record_id = record_id or uuid.uuid4().hex
        try:
            text = json.dumps(payload, separators=(",", ":"), sort_keys=True)
        except (TypeError, ValueError) as exc:
            raise EdgerunError(f"output of task {task_id!r} is not JSON-serialisable: {exc}") from exc
        self._buffer.append((record_id, task_id, now_ms() if created_ms is None else created_ms, text))
        if len(self._buffer) >= self.flush_threshold:
            self.flush()
        return record_id

    def flush(self) -> int:
        """Writes the buffered outputs in one transaction, applying the drop policy; returns rows inserted."""
        if not self._buffer:
            return 0
        buffer, self._buffer = self._buffer, []
        db = self._db
        inserted = duplicates = dropped_newest = 0
        db.execute("BEGIN IMMEDIATE")
        try:
            pending = self._count_state(PENDING)
            for row in buffer:
                if self.drop_policy == DROP_NEWEST and pending >= self.max_pending:
                    dropped_newest += 1
                    continue
                cursor = db.execute("INSERT OR IGNORE INTO outputs (record_id, task_id, created_ms, payload) "
                                    "VALUES (?, ?, ?, ?)", row)
                if cursor.rowcount == 1:
                    inserted += 1
                    pending += 1
                else:
                    duplicates += 1
            dropped_oldest = 0
            if pending > self.max_pending:
                dropped_oldest = pending - self.max_pending
                db.execute("DELETE FROM outputs WHERE seq IN (SELECT seq FROM outputs WHERE state = 0 "
                           "ORDER BY seq LIMIT ?)", (dropped_oldest,))
            self._prune_retained()
            self._bump({"stored": inserted, "duplicates_ignored": duplicates, "dropped_oldest": dropped_oldest,
                        "dropped_newest": dropped_newest}, in_transaction=True)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            self._buffer = buffer + self._buffer
            raise
        return inserted

    def _prune_retained(self) -> None:
        done = self._db.execute("SELECT COUNT(*) FROM outputs WHERE state != 0").fetchone()[0]
        if done > self.max_retained:
            self._db.execute("DELETE FROM outputs WHERE seq IN (SELECT seq FROM outputs WHERE state != 0 "
                             "ORDER BY seq LIMIT ?)", (done - self.max_retained,))

    # -- reading -------------------------------------------------------------------------------------------

    def read(self, task_id: str | None = None, *, since_ms: int | None = None,
             limit: int = 1000) -> list[StoredRecord]:
        """Outputs of one task (or all), oldest first; flushes first so a task reads what was just written."""
        self.flush()
        query = "SELECT seq, record_id, task_id, created_ms, payload FROM outputs WHERE 1 = 1"
        params: list[Any] = []
        if task_id is not None:
            query += " AND task_id = ?"
            params.append(task_id)
        if since_ms is not None:
            query += " AND created_ms >= ?"
            params.append(since_ms)
        query += " ORDER BY seq LIMIT ?"
        params.append(limit)
        return [self._record(row) for row in self._db.execute(query, params)]

    def pending_batch(self, limit: int, max_bytes: int | None = None) -> list[StoredRecord]:
        """The oldest records not yet uploaded: at most `limit`, and with `max_bytes` no more payload text than
        that (always at least one record), so a device holding large outputs reads one at a time."""
        self.flush()
        if max_bytes is None:
            rows = list(self._db.execute("SELECT seq, record_id, task_id, created_ms, payload FROM outputs "
                                         "WHERE state = 0 ORDER BY seq LIMIT ?", (limit,)))
            return [self._record(row) for row in rows]
        sizes = self._db.execute("SELECT seq, length(payload) FROM outputs WHERE state = 0 ORDER BY seq LIMIT ?",
                                 (limit,)).fetchall()
        seqs: list[int] = []
        total = 0
        for seq, size in sizes:
            if seqs and total + size > max_bytes:
                break
            seqs.append(seq)
            total += size
        return [self._record(row) for seq in seqs for row in self._db.execute(
            "SELECT seq, record_id, task_id, created_ms, payload FROM outputs WHERE seq = ?", (seq,))]

    @staticmethod
    def _record(row: tuple[int, str, str, int, str]) -> StoredRecord:
        return StoredRecord(row[0], row[1], row[2], row[3], json.loads(row[4]))

    def pending_count(self) -> int:
        self.flush()
        return self._count_state(PENDING)

    def _count_state(self, state: int) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM outputs WHERE state = ?", (state,)).fetchone()[0])

    # -- upload bookkeeping --------------------------------------------------------------------------------

    def mark(self, seqs: list[int], state: int) -> None:
        """Marks uploaded (or rejected) records; one transaction, so a kill leaves all or none marked."""
        if not seqs:
            return
        counter = "uploaded" if state == UPLOADED else "upload_rejected"
        self._db.execute("BEGIN IMMEDIATE")
        try:
            self._db.executemany("UPDATE outputs SET state = ? WHERE seq = ?", [(state, s) for s in seqs])
            self._bump({counter: len(seqs), "upload_batches": 1 if state == UPLOADED else 0}, in_transaction=True)
            self._prune_retained()
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    # -- counters ------------------------------------------------------------------------------------------

    def bump(self, name: str, amount: int = 1) -> None:
        self._bump({name: amount})

    def _bump(self, amounts: dict[str, int], in_transaction: bool = False) -> None:
        rows = [(name, amount) for name, amount in amounts.items() if amount]
        if not rows:
            return
        sql = ("INSERT INTO counters (name, value) VALUES (?, ?) "
               "ON CONFLICT (name) DO UPDATE SET value = value + excluded.value")
        if in_transaction:
            self._db.executemany(sql, rows)
        else:
            with self._db:
                self._db.execute("BEGIN IMMEDIATE")
                self._db.executemany(sql, rows)

    def counters(self) -> dict[str, int]:
        values = dict.fromkeys(COUNTERS, 0)
        values.update({name: int(value) for name, value in self._db.execute("SELECT name, value FROM counters")})
        values["pending"] = self._count_state(PENDING) + len(self._buffer)
        return values

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._db.close()


def read_outputs(path: str | Path, task_id: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
    """Stored outputs, oldest first, read-only: for task scripts in the compute container (another process),
    which find the file's path in their input as `outputs_db`."""
    connection = sqlite3.connect(f"file:{Path(path)}?mode=ro", uri=True)
    try:
        query = "SELECT record_id, task_id, created_ms, payload FROM outputs"
        params: list[Any] = []
        if task_id is not None:
            query += " WHERE task_id = ?"
            params.append(task_id)
        rows = connection.execute(query + " ORDER BY seq LIMIT ?", [*params, limit]).fetchall()
    finally:
        connection.close()
    return [{"record_id": r[0], "task_id": r[1], "created_ms": r[2], "payload": json.loads(r[3])} for r in rows]
