"""The compute container: each task run is a fresh worker process with a wall-time and memory limit.

A crashing, hanging or memory-hungry task kills only its worker; the agent reads the outcome and goes on.
(Walle runs tasks in per-thread interpreters inside the app; CPython 3.11 has no per-interpreter GIL,
so a process is the honest isolation boundary here.)
"""

from __future__ import annotations

import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORKER = Path(__file__).with_name("container_worker.py")
OUTCOMES = ("success", "failure", "timeout", "crash")


@dataclass
class RunResult:
    outcome: str  # one of OUTCOMES
    latency_ms: float
    output: Any = None
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome == "success"


def _limit_memory(memory_mb: int):  # type: ignore[no-untyped-def]
    def apply() -> None:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_in_container(task_dir: str | Path, entry: str, inputs: Any, *, timeout_s: float = 10.0,
                     memory_mb: int = 512, work_root: str | Path | None = None) -> RunResult:
    """Run `run(inputs)` from `entry` in `task_dir` in a worker process; never raises for task faults.

    The worker's scratch folder goes under `work_root` (the agent's state folder), so a run cut short by
    kill -9 leaves its leftovers where the next start sweeps them (`clear_scratch`), not in /tmp.
    """
    task_dir = Path(task_dir).resolve()
    if work_root is not None:
        Path(work_root).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgerun-run-", dir=work_root) as tmp:
        result_path = Path(tmp) / "result.json"
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-I", str(WORKER), str(task_dir), entry, str(result_path)],
                input=json.dumps(inputs).encode(), capture_output=True, timeout=timeout_s,
                preexec_fn=_limit_memory(memory_mb), cwd=tmp,
            )
        except subprocess.TimeoutExpired:
            return RunResult("timeout", (time.perf_counter() - start) * 1000, error=f"exceeded {timeout_s:g}s")
        latency = (time.perf_counter() - start) * 1000
        stderr_tail = proc.stderr.decode(errors="replace")[-2000:]
        if proc.returncode < 0:
            return RunResult("crash", latency, error=f"worker killed by signal {-proc.returncode}: {stderr_tail}")
        try:
            record = json.loads(result_path.read_text())
        except (OSError, ValueError):
            return RunResult("crash", latency, error=f"worker exited {proc.returncode} without a result: {stderr_tail}")
        if record.get("ok"):
            return RunResult("success", latency, output=record.get("output"))
        return RunResult("failure", latency, error=str(record.get("error", ""))[-2000:])


def clear_scratch(work_root: str | Path) -> None:
    """Remove scratch folders of runs that a crash interrupted (only ever called before any run starts)."""
    root = Path(work_root)
    if root.is_dir():
        for leftover in root.glob("edgerun-run-*"):
            shutil.rmtree(leftover, ignore_errors=True)
