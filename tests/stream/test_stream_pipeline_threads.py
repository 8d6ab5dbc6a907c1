"""DevicePipeline driven from two threads, as the fleet agent drives it: `pump` on the hooks thread while
the loop's check-ins register and unregister tasks; and a stop that leaves unprocessed events queued."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from edgerun.stream.event_queue import EventEmitter
from edgerun.stream.pipeline import DevicePipeline
from edgerun.stream.trigger_spec import TriggerMatch

CLICK = [{"sequence": ["click.buy"]}]


def test_tasks_register_and_unregister_while_a_triggered_task_runs(tmp_path: Path) -> None:
    pipeline = DevicePipeline(tmp_path / "stream")
    running, release = threading.Event(), threading.Event()

    def slow(match: TriggerMatch) -> dict[str, Any]:
        running.set()
        assert release.wait(30)
        return {"slow": match.record_id}

    pipeline.register_task("slow", CLICK, slow)
    app = EventEmitter(tmp_path / "stream")
    app.emit("click", "item", event_id="click.buy", time_ms=1)
    pump = threading.Thread(target=pipeline.pump)
    pump.start()
    try:
        assert running.wait(30)
        # The loop's side, while the task runs: neither waits for it (no lock is held across a run).
        pipeline.register_task("fast", CLICK, lambda match: {"fast": True})
        pipeline.unregister_task("slow")
        assert pipeline.trie.task_ids == ["fast"] and pump.is_alive()
    finally:
        release.set()
        pump.join(30)
    assert [r.payload for r in pipeline.store.read("slow")] and not pipeline.store.read("fast")
    app.emit("click", "item", event_id="click.buy", time_ms=2)
    assert pipeline.pump() == 1  # the next event runs the task registered meanwhile, not the removed one
    assert len(pipeline.store.read("slow")) == 1 and [r.payload for r in pipeline.store.read("fast")] == [{"fast": True}]
    pipeline.close()


def test_a_stopped_pump_leaves_the_event_in_hand_and_the_rest_queued(tmp_path: Path) -> None:
    pipeline = DevicePipeline(tmp_path / "stream")
    seen: list[int] = []

    def stopping(match: TriggerMatch) -> dict[str, Any]:
        seen.append(match.events[-1].time_ms)
        pipeline.stopping.set()  # the agent stops while this run is in hand (and cancels it)
        return {"t": seen[-1]}

    pipeline.register_task("t", CLICK, stopping)
    app = EventEmitter(tmp_path / "stream")
    for t in (1, 2, 3):
        app.emit("click", "item", event_id="click.buy", time_ms=t)
    assert pipeline.pump() == 0 and seen == [1] and not pipeline.store.read("t")
    pipeline.close()

    restarted = DevicePipeline(tmp_path / "stream")  # the next start runs all three
    restarted.register_task("t", CLICK, lambda match: {"t": match.events[-1].time_ms})
    assert restarted.pump() == 3
    assert sorted(r.payload["t"] for r in restarted.store.read("t")) == [1, 2, 3]
    restarted.close()
    app.close()
