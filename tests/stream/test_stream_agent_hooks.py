"""StreamHooks with the fleet's real compute container: what a task sees, outputs, failures, deactivation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgerun.fleet.container import RunResult, run_in_container
from edgerun.stream.agent_hooks import StreamHooks
from edgerun.stream.event_queue import EventEmitter
from edgerun.stream.pipeline import DevicePipeline

BODY = """
def run(inputs):
    kinds = [e["kind"] for e in inputs["events"]]
    if inputs["events"][0]["contents"].get("explode"):
        raise RuntimeError("task bug")
    return kinds if inputs["condition"]["capture"] == "page" else {"kinds": kinds}
"""


def container(tmp_path: Path) -> Any:
    task = tmp_path / "task"
    task.mkdir()
    (task / "main.py").write_text(BODY)

    def run_fn(inputs: Any) -> RunResult:
        return run_in_container(task, "main.py", inputs, timeout_s=20)

    return run_fn


def test_hooks_register_triggers_run_the_container_and_store_outputs(tmp_path: Path) -> None:
    hooks = StreamHooks(DevicePipeline(tmp_path / "stream"))
    run_fn = container(tmp_path)
    hooks.on_task_activated("visit", {"triggers": [{"sequence": ["page_exit@item"], "capture": "page"}]}, run_fn)
    hooks.on_task_activated("clicks", {"triggers": [["click.buy"]]}, run_fn)
    hooks.on_task_activated("no_triggers", {"triggers": []}, run_fn)
    assert sorted(hooks.pipeline.trie.task_ids) == ["clicks", "visit"]

    app = EventEmitter(tmp_path / "stream")
    app.emit("page_enter", "item", time_ms=1)
    app.emit("click", "item", event_id="click.buy", time_ms=2)
    app.emit("click", "item", event_id="click.buy", time_ms=3, contents={"explode": True})
    app.emit("page_exit", "item", time_ms=4)
    hooks.poll()

    store = hooks.pipeline.store
    assert [r.payload for r in store.read("visit")] == [{"output": ["page_enter", "click", "click", "page_exit"]}]
    assert [r.payload for r in store.read("clicks")] == [{"kinds": ["click"]}]
    assert hooks.failed_runs == 1  # the exploding run: reported by the container, no output stored

    hooks.on_task_deactivated("clicks")
    app.emit("click", "item", event_id="click.buy", time_ms=5)
    hooks.poll()
    assert len(store.read("clicks")) == 1
    hooks.close()


ONCE_BODY = """
import os

def run(inputs):
    with open(os.path.join(inputs["data_dir"], "samples.txt")) as f:
        return {"read": f.read()}
"""


def test_run_once_runs_a_version_once_on_its_data_folder_and_stores_its_output_under_the_record_id(
        tmp_path: Path) -> None:
    task = tmp_path / "task"
    task.mkdir()
    (task / "main.py").write_text(ONCE_BODY)
    hooks = StreamHooks(DevicePipeline(tmp_path / "stream"))
    (hooks.data_root / "learn").mkdir()
    (hooks.data_root / "learn" / "samples.txt").write_text("local samples")
    runs: list[Any] = []

    def run_fn(inputs: Any) -> RunResult:
        runs.append(inputs)
        return run_in_container(task, "main.py", inputs, timeout_s=20, readonly_shares=hooks.shared_paths("learn"))

    hooks.on_task_activated("learn", {"run_once": {"record_id": "learn:1"}}, run_fn)
    hooks.poll()
    hooks.poll()
    assert [(r.record_id, r.payload) for r in hooks.pipeline.store.read("learn")] == [
        ("learn:1", {"read": "local samples"})]
    assert len(runs) == 1 and runs[0]["data_dir"] == str(hooks.data_root / "learn")
    hooks.close()

    # the agent started again announces the active version again: it is not run a second time
    again = StreamHooks(DevicePipeline(tmp_path / "stream"))
    again.on_task_activated("learn", {"run_once": {"record_id": "learn:1"}}, run_fn)
    again.poll()
    assert len(runs) == 1
    # a run cancelled (the agent stopping) is not marked: the next start runs it
    again.on_task_activated("learn", {"run_once": {"record_id": "learn:2"}}, lambda _: RunResult("cancelled", 0.0))
    again.poll()
    again.on_task_activated("learn", {"run_once": {"record_id": "learn:2"}}, run_fn)
    again.poll()
    assert len(runs) == 2
    assert [r.record_id for r in again.pipeline.store.read("learn")] == ["learn:1", "learn:2"]
    again.close()
