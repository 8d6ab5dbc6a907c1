"""The durable hand-off of events from the app process to the agent process: a SQLite (WAL) queue.

The app writes with EventEmitter; the pipeline in the agent reads in order with EventQueue and commits its
cursor after the outputs of those events are stored, so a crash replays events (at-least-once) and the
idempotent record ids make the replay harmless. Consumed events are kept for a while so that the pipeline
can rebuild its partial trigger matches after a restart.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from edgerun.errors import EdgerunError
from edgerun.stream.events import Event, EventKind, now_ms
from edgerun.stream.sqlite_file import open_database, salvage_rows

EVENTS_FILE = "events.db"
DEFAULT_MAX_QUEUED = 100_000
DEFAULT_KEEP_CONSUMED = 4096

_SCHEMA = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    uid TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS queue_meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO queue_meta (name, value) VALUES ('cursor', 0), ('events_emitted', 0),
    ('events_dropped', 0), ('events_duplicate', 0), ('events_malformed', 0), ('corrupt_recoveries', 0);
"""


def _salvage(old: sqlite3.Connection, fresh: sqlite3.Connection) -> int:
    salvage_rows(old, fresh, "SELECT name, value FROM queue_meta",
                 "INSERT OR REPLACE INTO queue_meta (name, value) VALUES (?, ?)")
    return salvage_rows(old, fresh, "SELECT seq, uid, body FROM events ORDER BY seq",
                        "INSERT OR IGNORE INTO events (seq, uid, body) VALUES (?, ?, ?)")


class _QueueFile:
    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / EVENTS_FILE
        opened = open_database(self.path, _SCHEMA, _salvage)
        self.db = opened.connection
        if opened.recovered_from is not None:
            self.db.execute("UPDATE queue_meta SET value = value + 1 WHERE name = 'corrupt_recoveries'")

    def meta(self, name: str) -> int:
        return int(self.db.execute("SELECT value FROM queue_meta WHERE name = ?", (name,)).fetchone()[0])

    def add_meta(self, name: str, amount: int) -> None:
        if amount:
            self.db.execute("UPDATE queue_meta SET value = value + ? WHERE name = ?", (amount, name))

    def stats(self) -> dict[str, int]:
        values = {name: int(value) for name, value in self.db.execute("SELECT name, value FROM queue_meta")}
        values["queued"] = int(self.db.execute("SELECT COUNT(*) FROM events WHERE seq > ?",
                                               (values["cursor"],)).fetchone()[0])
        return values

    def close(self) -> None:
        self.db.close()


class EventEmitter(_QueueFile):
    """The app side: `emit(...)` appends an event to the agent's queue (durable when it returns)."""

    def __init__(self, state_dir: Path, *, max_queued_events: int = DEFAULT_MAX_QUEUED) -> None:
        super().__init__(state_dir)
        self.max_queued_events = max_queued_events

    def emit(self, kind: EventKind | str, page_id: str, *, event_id: str | None = None,
             time_ms: int | None = None, contents: dict[str, Any] | None = None, uid: str | None = None) -> Event:
        event = Event(kind, page_id, now_ms() if time_ms is None else time_ms, event_id=event_id, uid=uid,
                      contents=contents)
        self.emit_events([event])
        return event

    def emit_events(self, events: list[Event]) -> int:
        """Appends events in one transaction; an event whose uid is already queued is ignored."""
        db = self.db
        db.execute("BEGIN IMMEDIATE")
        try:
            added = 0
            for event in events:
                cursor = db.execute("INSERT OR IGNORE INTO events (uid, body) VALUES (?, ?)",
                                    (event.uid, event.to_json()))
                added += cursor.rowcount
            self.add_meta("events_emitted", added)
            self.add_meta("events_duplicate", len(events) - added)
            self._enforce_bound()
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        return added

    def _enforce_bound(self) -> None:
        # Drop the oldest unconsumed events beyond the bound: a phone that never runs the agent must not fill
        # its disk. The cheap max(seq) test avoids counting on every emit.
        cursor = self.meta("cursor")
        last = self.db.execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]
        if last - cursor <= self.max_queued_events:
            return
        queued = self.db.execute("SELECT COUNT(*) FROM events WHERE seq > ?", (cursor,)).fetchone()[0]
        excess = queued - self.max_queued_events
        if excess > 0:
            self.db.execute("DELETE FROM events WHERE seq IN (SELECT seq FROM events WHERE seq > ? "
                            "ORDER BY seq LIMIT ?)", (cursor, excess))
            self.add_meta("events_dropped", excess)


class EventQueue(_QueueFile):
    """The agent side: reads events after the cursor in order; the cursor moves only on commit()."""

    def __init__(self, state_dir: Path, *, keep_consumed: int = DEFAULT_KEEP_CONSUMED) -> None:
        super().__init__(state_dir)
        self.keep_consumed = keep_consumed

    def read(self, limit: int) -> list[tuple[int, Event | None]]:
        """The next events after the cursor; a row that is not a valid event comes back as None (and is
        counted), so one bad write from an app cannot stall the queue."""
        rows = self.db.execute("SELECT seq, body FROM events WHERE seq > ? ORDER BY seq LIMIT ?",
                               (self.meta("cursor"), limit)).fetchall()
        events: list[tuple[int, Event | None]] = []
        for seq, body in rows:
            try:
                events.append((seq, Event.from_dict(_loads(body))))
            except (EdgerunError, ValueError, TypeError):
                self.add_meta("events_malformed", 1)
                events.append((seq, None))
        return events

    def commit(self, seq: int) -> None:
        """Everything up to `seq` is processed; prunes consumed events beyond the replay tail."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.execute("UPDATE queue_meta SET value = ? WHERE name = 'cursor' AND value < ?", (seq, seq))
            self.db.execute("DELETE FROM events WHERE seq <= ?", (seq - self.keep_consumed,))
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def consumed_tail(self, limit: int) -> list[Event]:
        """The last `limit` consumed events, oldest first: replayed to rebuild partial matches."""
        rows = self.db.execute("SELECT body FROM events WHERE seq <= ? ORDER BY seq DESC LIMIT ?",
                               (self.meta("cursor"), limit)).fetchall()
        events = []
        for (body,) in reversed(rows):
            try:
                events.append(Event.from_dict(_loads(body)))
            except (EdgerunError, ValueError, TypeError):
                continue
        return events


def _loads(body: str) -> dict[str, Any]:
    data = json.loads(body)
    if not isinstance(data, dict):
        raise ValueError("an event is a JSON object")
    return data
