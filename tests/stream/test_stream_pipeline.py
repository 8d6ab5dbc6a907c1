"""DevicePipeline: app process → durable queue → trie → task → collective storage → tunnel → cloud."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from stream_helpers import REPO, CloudServer

from edgerun.stream.event_queue import EventEmitter
from edgerun.stream.pipeline import DevicePipeline
from edgerun.stream.trigger_spec import TriggerMatch
from edgerun.stream.uploader import Backoff

CART_FUNNEL = [{"sequence": ["page_enter@item", "click.add_cart", "page_enter@cart"], "within_s": 60}]


def funnel_output(match: TriggerMatch) -> dict[str, Any]:
    return {"item": match.events[0].contents["item"], "seconds": (match.events[-1].time_ms
                                                                  - match.events[0].time_ms) / 1000}


def test_events_from_the_app_process_become_records_in_the_cloud(tmp_path: Path, cloud: CloudServer) -> None:
    state = tmp_path / "device"
    app = textwrap.dedent("""
        import sys
        from edgerun.stream.event_queue import EventEmitter
        emitter = EventEmitter(sys.argv[1])
        t = 1_000_000
        for item in range(5):
            emitter.emit("page_enter", "item", time_ms=t, contents={"item": item}); t += 1000
            emitter.emit("scroll", "item", time_ms=t); t += 1000
            if item % 2 == 0:
                emitter.emit("click", "item", event_id="click.add_cart", time_ms=t); t += 1000
            emitter.emit("page_exit", "item", time_ms=t); t += 1000
            emitter.emit("page_enter", "cart", time_ms=t); t += 1000
            emitter.emit("page_exit", "cart", time_ms=t); t += 1000
    """)
    subprocess.run([sys.executable, "-c", app, str(state)], check=True, cwd=REPO)
    pipeline = DevicePipeline(state, cloud.url, "dev-funnel", backoff=Backoff(0.01, 0.1))
    pipeline.register_task("cart_funnel", CART_FUNNEL, funnel_output)
    assert pipeline.flush(timeout_s=20) == 3
    got = sorted((r["payload"]["item"], r["payload"]["seconds"]) for r in cloud.records(device_id="dev-funnel"))
    assert got == [(0, 4.0), (2, 4.0), (4, 4.0)]
    counters = pipeline.counters()
    assert counters["events_processed"] == 28 and counters["queue_queued"] == 0 and counters["uploaded"] == 3


def test_a_condition_completes_across_an_agent_restart(tmp_path: Path) -> None:
    emitter = EventEmitter(tmp_path)
    first = DevicePipeline(tmp_path)
    first.register_task("funnel", CART_FUNNEL, funnel_output)
    emitter.emit("page_enter", "item", time_ms=1000, contents={"item": 7})
    emitter.emit("click", "item", event_id="click.add_cart", time_ms=2000)
    assert first.pump() == 2 and first.store.read("funnel") == []
    first.close()  # the agent stops with a partial match pending

    second = DevicePipeline(tmp_path)
    second.register_task("funnel", CART_FUNNEL, funnel_output)
    emitter.emit("page_enter", "cart", time_ms=3000)
    second.pump()
    assert [r.payload for r in second.store.read("funnel")] == [{"item": 7, "seconds": 2.0}]


def test_kill_9_between_outputs_and_cursor_reruns_without_duplicates(tmp_path: Path) -> None:
    emitter = EventEmitter(tmp_path)
    for i in range(6):
        emitter.emit("click", "p", event_id="buy", time_ms=i, contents={"i": i})
    pid = os.fork()
    if pid == 0:
        try:
            pipeline = DevicePipeline(tmp_path)
            seen: list[int] = []

            def crash_on_fourth(match: TriggerMatch) -> dict[str, Any]:
                seen.append(1)
                if len(seen) == 4:
                    pipeline.store.flush()  # three outputs durable, the cursor not yet moved
                    os.kill(os.getpid(), signal.SIGKILL)
                return {"i": match.events[0].contents["i"]}

            pipeline.register_task("buy", [["buy"]], crash_on_fourth)
            pipeline.pump()
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL

    pipeline = DevicePipeline(tmp_path)
    assert len(pipeline.store.read("buy")) == 3
    pipeline.register_task("buy", [["buy"]], lambda m: {"i": m.events[0].contents["i"]})
    pipeline.pump()
    assert [r.payload["i"] for r in pipeline.store.read("buy")] == list(range(6))
    assert pipeline.counters()["duplicates_ignored"] == 3  # the re-run produced the same ids


def test_a_failing_task_does_not_stop_the_others(tmp_path: Path) -> None:
    pipeline = DevicePipeline(tmp_path)

    def broken(match: TriggerMatch) -> dict[str, Any]:
        raise ValueError("task bug")

    pipeline.register_task("broken", [["x"]], broken)
    pipeline.register_task("fine", [["x"]], lambda m: {"ok": True})
    for t in range(3):
        pipeline.emit("click", "p", event_id="x", time_ms=t)
    pipeline.pump()
    assert len(pipeline.store.read("fine")) == 3
    assert pipeline.counters()["task_errors"] == 3
    pipeline.unregister_task("fine")
    pipeline.emit("click", "p", event_id="x", time_ms=9)
    pipeline.pump()
    assert len(pipeline.store.read("fine")) == 3
