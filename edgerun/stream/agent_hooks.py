"""The stream pipeline inside the fleet device agent: implements the agent's `TaskHooks` protocol.

    agent = Agent(server_url, device_id, state_dir, ...)
    agent.hooks = StreamHooks.for_agent(agent)

The agent announces each active task; a task whose config has `triggers` is registered in the pipeline, and
when a condition matches, the task runs in the agent's compute container (the `run_fn` the agent hands
over) with the match as its input; its output becomes a record in collective storage and is uploaded to
the fleet server's /v1/stream. `poll()` runs in every agent step: under `run_forever` on a thread of its
own (the agent's loop keeps checking in while a triggered task runs, and a newer assignment cancels it).

A task whose config has `run_once: {"record_id": ID}` runs once when that version is activated (in the next
`poll()`), with {"data_dir", "outputs_db"} as its input, and its output is stored under ID and uploaded like
a trigger's. `data_dir` is `<agent state>/stream/data/<task>`, the device's own files for that task (a
federated job's local samples: docs/federated.md). Each run of a task sees its own task's data folder
(read-only, like collective storage) and no other task's: `shared_paths(task)` names only that one, and at the
bubblewrap levels nothing else of `data/` is in the run's mount view. (At the rlimit levels there is no mount
view: `data/` is 0711, so a run of a root agent's own uid cannot list it, but reads another task's folder
whose name it knows; docs/security.md.)
A marker per (task, ID), written after the output is stored, keeps an agent started again from running it
twice; should it die in between, the second run's output has the same ID, which the store and the
server's /v1/stream keep once. A failed run is reported like any run and not tried again; a cancelled one
(the agent stopping) is not marked, so the next start runs it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from edgerun.stream.pipeline import DevicePipeline
from edgerun.stream.trigger_spec import TriggerMatch

log = logging.getLogger(__name__)

STREAM_STATE_DIR = "stream"  # under the agent's state dir; the app's EventEmitter writes events.db there
DATA_DIR = "data"  # under STREAM_STATE_DIR: a folder per task, the device's own files for it (read-only to its runs)
ONCE_DIR = "once"  # under STREAM_STATE_DIR: a marker per `run_once` record already stored


class _RunResult(Protocol):
    @property
    def ok(self) -> bool: ...

    output: Any
    error: str


class _AgentLike(Protocol):
    server_url: str
    device_id: str
    state_dir: Path

    @property
    def token(self) -> str: ...


RunFn = Callable[[Any], Any]


class StreamHooks:
    def __init__(self, pipeline: DevicePipeline) -> None:
        self.pipeline = pipeline
        self.failed_runs = 0
        self.poll_errors = 0
        self.data_root = pipeline.state_dir / DATA_DIR
        self.data_root.mkdir(parents=True, exist_ok=True)
        # Traversable, not listable: where a run has no mount view (rlimit levels), its own uid reaches its
        # own task's folder by name but cannot list the others'.
        self.data_root.chmod(0o711)
        # task -> (record id, run) waiting for the next poll; the agent may announce while a poll runs
        self._once: dict[str, tuple[str, RunFn]] = {}
        self._once_lock = threading.Lock()

    @classmethod
    def for_agent(cls, agent: _AgentLike, **pipeline_options: Any) -> StreamHooks:
        """A pipeline in `<agent state>/stream`, uploading to the agent's server with the agent's token."""
        pipeline = DevicePipeline(agent.state_dir / STREAM_STATE_DIR, agent.server_url.rstrip("/") + "/v1/stream",
                                  agent.device_id, token=lambda: agent.token, **pipeline_options)
        return cls(pipeline)

    def on_task_activated(self, task_id: str, config: dict[str, Any], run_fn: RunFn) -> None:
        once = config.get("run_once")
        record_id = once.get("record_id") if isinstance(once, dict) else None  # checked at install: task_schema
        with self._once_lock:
            self._once.pop(task_id, None)  # a version replaced before its run: only the active one runs
            if isinstance(record_id, str) and record_id and not self._once_marker(task_id, record_id).exists():
                self._once[task_id] = (record_id, run_fn)
        triggers = config.get("triggers")
        if not triggers:
            self.pipeline.unregister_task(task_id)  # a new version may have dropped its triggers
            return
        self.pipeline.register_task(task_id, triggers, self._runner(run_fn))

    def _runner(self, run_fn: RunFn) -> Callable[[TriggerMatch], dict[str, Any] | None]:
        def run(match: TriggerMatch) -> dict[str, Any] | None:
            # Written first, so that the task reads every earlier output (read-your-writes across processes).
            self.pipeline.store.flush()
            inputs = {**match.to_json(), "outputs_db": str(self.pipeline.store.path)}
            result: _RunResult = run_fn(inputs)
            if not result.ok:
                self.failed_runs += 1
                log.warning("task %s failed on a trigger match: %s", match.task_id, result.error)
                return None
            if result.output is None:
                return None
            return result.output if isinstance(result.output, dict) else {"output": result.output}

        return run

    def _once_marker(self, task_id: str, record_id: str) -> Path:
        key = hashlib.sha256(f"{task_id}\0{record_id}".encode()).hexdigest()
        return self.pipeline.state_dir / ONCE_DIR / key

    def _run_once(self) -> None:
        """The `run_once` runs of versions activated since the last poll: output stored under its record id."""
        with self._once_lock:
            due, self._once = self._once, {}
        for task_id, (record_id, run_fn) in due.items():
            self.pipeline.store.flush()
            result: _RunResult = run_fn({"data_dir": str(self.data_root / task_id),
                                         "outputs_db": str(self.pipeline.store.path)})
            if getattr(result, "outcome", "") == "cancelled":
                continue  # replaced by a newer version (announced on its own) or the agent stopping: runs at its next start
            if not result.ok:
                self.failed_runs += 1
                log.warning("task %s failed its run_once %s: %s", task_id, record_id, result.error)
            elif result.output is not None:
                output = result.output if isinstance(result.output, dict) else {"output": result.output}
                self.pipeline.store_output(task_id, output, record_id=record_id)
                self.pipeline.store.flush()
            marker = self._once_marker(task_id, record_id)  # a failed run is reported, not retried
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()

    def shared_paths(self, task_id: str) -> list[Path]:
        """What the agent binds read-only into the compute container of a run of `task_id`: collective storage
        and that task's own data folder, never another task's. The folder is made here, so it is bound even
        for a warm worker started before the app puts the task's first files in it."""
        data = self.data_root / task_id
        if data.parent != self.data_root or task_id in ("", ".", ".."):  # task names are checked at install
            raise ValueError(f"not a task name: {task_id!r}")
        data.mkdir(exist_ok=True)
        db = Path(self.pipeline.store.path)
        return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"), data]

    def on_task_deactivated(self, task_id: str) -> None:
        with self._once_lock:
            self._once.pop(task_id, None)
        self.pipeline.unregister_task(task_id)

    def poll(self) -> None:
        # The agent's loop must outlive a bad moment of the pipeline (a full disk, a locked file): log it and
        # try again on the next step; nothing is lost, the queue and the outputs are on disk.
        try:
            self._run_once()
            self.pipeline.pump()
            self.pipeline.upload()
        except Exception as exc:
            self.poll_errors += 1
            log.exception("stream pipeline step failed: %s", exc)

    def stop(self) -> None:
        """The agent is stopping: the pump in progress ends after the event in hand (its runs cancelled by
        the agent), and the events after it stay queued for the next start."""
        self.pipeline.stopping.set()

    def close(self) -> None:
        self.pipeline.close()
