"""Collective storage and the event queue: real SQLite files, drop policies, counters, corrupt files."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import pytest

from edgerun.errors import EdgerunError
from edgerun.stream.event_queue import EventEmitter, EventQueue
from edgerun.stream.storage import DROP_NEWEST, UPLOADED, CollectiveStore


def test_wal_mode_buffering_and_read_your_writes(tmp_path: Path) -> None:
    store = CollectiveStore(tmp_path / "outputs.db", flush_threshold=3)
    assert store._db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.put("a", {"v": 1})
    store.put("a", {"v": 2})
    other = sqlite3.connect(tmp_path / "outputs.db")
    assert other.execute("SELECT COUNT(*) FROM outputs").fetchone()[0] == 0  # still buffered
    assert [r.payload["v"] for r in store.read("a")] == [1, 2]  # a read flushes first
    assert other.execute("SELECT COUNT(*) FROM outputs").fetchone()[0] == 2
    store.put("b", {"v": 3}, record_id="same")
    store.put("b", {"v": 4}, record_id="same")
    assert [r.payload for r in store.read("b")] == [{"v": 3}]
    assert store.counters()["duplicates_ignored"] == 1
    with pytest.raises(EdgerunError):
        store.put("c", {"v": object()})


def test_drop_oldest_keeps_the_newest_and_counts(tmp_path: Path) -> None:
    store = CollectiveStore(tmp_path / "outputs.db", max_pending=5)
    for i in range(8):
        store.put("t", {"i": i})
    assert [r.payload["i"] for r in store.pending_batch(100)] == [3, 4, 5, 6, 7]
    assert store.counters()["dropped_oldest"] == 3


def test_drop_newest_refuses_new_records_and_counts(tmp_path: Path) -> None:
    store = CollectiveStore(tmp_path / "outputs.db", max_pending=5, drop_policy=DROP_NEWEST)
    for i in range(8):
        store.put("t", {"i": i})
    assert [r.payload["i"] for r in store.pending_batch(100)] == [0, 1, 2, 3, 4]
    assert store.counters()["dropped_newest"] == 3
    store.mark([r.seq for r in store.pending_batch(2)], UPLOADED)  # room for two more
    store.put("t", {"i": 8})
    assert store.pending_count() == 4


def test_uploaded_records_stay_readable_up_to_the_retention(tmp_path: Path) -> None:
    store = CollectiveStore(tmp_path / "outputs.db", max_retained=3)
    for i in range(6):
        store.put("t", {"i": i})
    store.mark([r.seq for r in store.pending_batch(100)], UPLOADED)
    assert [r.payload["i"] for r in store.read("t")] == [3, 4, 5]
    assert store.counters()["uploaded"] == 6


def test_flushed_records_survive_kill_9(tmp_path: Path) -> None:
    db = tmp_path / "outputs.db"
    pid = os.fork()
    if pid == 0:
        try:
            store = CollectiveStore(db, flush_threshold=1000)
            for i in range(100):
                store.put("t", {"i": i})
            store.flush()
            store.put("t", {"i": 100})  # buffered, never flushed: allowed to be lost
        finally:
            os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    assert [r.payload["i"] for r in CollectiveStore(db).read("t", limit=1000)] == list(range(100))


@pytest.mark.parametrize("damage", ["garbage", "truncated_header", "bad_page"])
def test_a_corrupt_store_is_quarantined_salvaged_and_counted(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "outputs.db"
    store = CollectiveStore(db)
    for i in range(300):
        store.put("t", {"i": i, "pad": "p" * 100})
    store.close()
    # Checkpoint the WAL into the main file, so damage to the file is damage to the data.
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    data = bytearray(db.read_bytes())
    if damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    elif damage == "truncated_header":
        data = data[:50]
    else:
        page = bytes(data).index(b'"i":150,') // 4096  # the table page holding row 150
        data[page * 4096:(page + 1) * 4096] = os.urandom(4096)
    db.write_bytes(bytes(data))

    recovered = CollectiveStore(db)  # must not raise
    counters = recovered.counters()
    assert counters["corrupt_recoveries"] == 1
    assert recovered.recovered_from is not None and recovered.recovered_from.exists()
    if damage == "bad_page":
        assert 0 < counters["salvaged_records"] < 300  # the rows before the damaged page are saved
        assert len(recovered.read("t", limit=1000)) == counters["salvaged_records"]
    recovered.put("t", {"i": "after"})
    assert recovered.read("t", limit=1000)[-1].payload == {"i": "after"}


def test_event_queue_is_ordered_bounded_and_resumes_at_its_cursor(tmp_path: Path) -> None:
    emitter = EventEmitter(tmp_path, max_queued_events=10)
    for i in range(15):
        emitter.emit("click", "p", time_ms=i, uid=f"u{i}")
    emitter.emit("click", "p", time_ms=99, uid="u14")  # same uid: ignored
    stats = emitter.stats()
    assert stats["events_dropped"] == 5 and stats["events_duplicate"] == 1 and stats["queued"] == 10
    queue = EventQueue(tmp_path)
    batch = queue.read(4)
    assert [e.uid for _, e in batch] == ["u5", "u6", "u7", "u8"]
    queue.commit(batch[-1][0])
    queue.close()
    again = EventQueue(tmp_path)  # a restart resumes after the cursor
    assert [e.uid for _, e in again.read(100)] == [f"u{i}" for i in range(9, 15)]
    assert [e.uid for e in again.consumed_tail(2)] == ["u7", "u8"]


def test_a_corrupt_event_queue_is_recovered(tmp_path: Path) -> None:
    EventEmitter(tmp_path).emit("click", "p", time_ms=1)
    (tmp_path / "events.db").write_bytes(b"this is not a database at all" * 100)
    for sidecar in ("events.db-wal", "events.db-shm"):
        (tmp_path / sidecar).unlink(missing_ok=True)
    emitter = EventEmitter(tmp_path)
    emitter.emit("click", "p", time_ms=2, uid="fresh")
    assert emitter.stats()["corrupt_recoveries"] == 1
    assert [e.uid for _, e in EventQueue(tmp_path).read(10)] == ["fresh"]


def test_a_malformed_event_row_is_skipped_and_counted(tmp_path: Path) -> None:
    from edgerun.stream.pipeline import DevicePipeline

    emitter = EventEmitter(tmp_path)
    emitter.emit("click", "p", event_id="x", time_ms=1)
    emitter.db.execute("INSERT INTO events (uid, body) VALUES ('bad1', 'not json'), ('bad2', '[1]'), "
                       "('bad3', '{\"kind\": \"wink\", \"page_id\": \"p\", \"time_ms\": 2}')")
    emitter.emit("click", "p", event_id="x", time_ms=3)
    pipeline = DevicePipeline(tmp_path)
    pipeline.register_task("t", [["x"]], lambda m: {"t": m.events[0].time_ms})
    assert pipeline.pump() == 5
    assert [r.payload["t"] for r in pipeline.store.read("t")] == [1, 3]
    assert pipeline.counters()["queue_events_malformed"] == 3
