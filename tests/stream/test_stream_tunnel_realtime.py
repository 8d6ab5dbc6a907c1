"""The real-time tunnel: a pump that stored outputs sends them at once over the keep-alive connection, and
the tasks one event matched run side by side with their outputs stored in match order."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from stream_helpers import CloudServer

from edgerun.stream.event_queue import EventEmitter
from edgerun.stream.pipeline import DevicePipeline
from edgerun.stream.trigger_spec import TriggerMatch
from edgerun.stream.uploader import Backoff

BUY = [{"sequence": ["click.buy"]}]


def test_realtime_pipeline_uploads_when_outputs_are_stored(tmp_path: Path, cloud: CloudServer) -> None:
    emitter = EventEmitter(tmp_path)
    pipeline = DevicePipeline(tmp_path, cloud.url, "dev-realtime", backoff=Backoff(0.01, 0.1), realtime=True)
    pipeline.register_task("buys", BUY, lambda m: {"item": m.events[0].contents["item"]})
    for item in range(3):
        emitter.emit("click", "item", event_id="click.buy", contents={"item": item})
        assert pipeline.pump() == 1
        # No upload() call: the pump sent the batch itself, and the cloud holds it now.
        got = sorted(r["payload"]["item"] for r in cloud.records(device_id="dev-realtime"))
        assert got == list(range(item + 1))
    counters = pipeline.counters()
    assert counters["uploaded"] == 3 and counters["pending"] == 0 and counters["upload_batches"] == 3
    pipeline.close()


def test_batch_pipeline_waits_for_upload(tmp_path: Path, cloud: CloudServer) -> None:
    emitter = EventEmitter(tmp_path)
    pipeline = DevicePipeline(tmp_path, cloud.url, "dev-batched", backoff=Backoff(0.01, 0.1))
    pipeline.register_task("buys", BUY, lambda m: {"item": m.events[0].contents["item"]})
    emitter.emit("click", "item", event_id="click.buy", contents={"item": 1})
    assert pipeline.pump() == 1
    assert cloud.records(device_id="dev-batched") == []
    assert pipeline.upload() == 1
    assert len(cloud.records(device_id="dev-batched")) == 1
    pipeline.close()


def test_matched_tasks_run_side_by_side(tmp_path: Path) -> None:
    emitter = EventEmitter(tmp_path)
    pipeline = DevicePipeline(tmp_path, max_concurrent_runs=3)
    both_inside = threading.Barrier(3, timeout=10)  # passes only if all three runs are in flight at once

    def task(name: str) -> Any:
        def run(match: TriggerMatch) -> dict[str, Any]:
            both_inside.wait()
            time.sleep(0.01 * (3 - int(name[-1])))  # finish in reverse order
            return {"task": name, "thread": threading.current_thread().name}
        return run

    for name in ("t1", "t2", "t3"):
        pipeline.register_task(name, BUY, task(name))
    emitter.emit("click", "item", event_id="click.buy", contents={"item": 1})
    assert pipeline.pump() == 1
    outputs = {name: pipeline.store.read(name) for name in ("t1", "t2", "t3")}
    assert all(len(rows) == 1 for rows in outputs.values()), outputs
    assert pipeline.counters()["matches"] == 3 and pipeline.counters()["task_errors"] == 0
    pipeline.close()
