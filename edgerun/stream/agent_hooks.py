"""The stream pipeline inside the fleet device agent: implements the agent's `TaskHooks` protocol.

    agent = Agent(server_url, device_id, state_dir, ...)
    agent.hooks = StreamHooks.for_agent(agent)

The agent announces each active task; a task whose config has `triggers` is registered in the pipeline, and
when a condition matches, the task runs in the agent's compute container (the `run_fn` the agent hands
over) with the match as its input; its output becomes a record in collective storage and is uploaded to
the fleet server's /v1/stream. `poll()` runs in every agent step: under `run_forever` on a thread of its
own (the agent's loop keeps checking in while a triggered task runs, and a newer assignment cancels it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from edgerun.stream.pipeline import DevicePipeline
from edgerun.stream.trigger_spec import TriggerMatch

log = logging.getLogger(__name__)

STREAM_STATE_DIR = "stream"  # under the agent's state dir; the app's EventEmitter writes events.db there


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

    @classmethod
    def for_agent(cls, agent: _AgentLike, **pipeline_options: Any) -> StreamHooks:
        """A pipeline in `<agent state>/stream`, uploading to the agent's server with the agent's token."""
        pipeline = DevicePipeline(agent.state_dir / STREAM_STATE_DIR, agent.server_url.rstrip("/") + "/v1/stream",
                                  agent.device_id, token=lambda: agent.token, **pipeline_options)
        return cls(pipeline)

    def on_task_activated(self, task_id: str, config: dict[str, Any], run_fn: RunFn) -> None:
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

    def shared_paths(self) -> list[Path]:
        """Collective storage, which the agent binds read-only into every task's compute container."""
        db = Path(self.pipeline.store.path)
        return [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]

    def on_task_deactivated(self, task_id: str) -> None:
        self.pipeline.unregister_task(task_id)

    def poll(self) -> None:
        # The agent's loop must outlive a bad moment of the pipeline (a full disk, a locked file): log it and
        # try again on the next step; nothing is lost, the queue and the outputs are on disk.
        try:
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
