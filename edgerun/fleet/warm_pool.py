"""Warm workers: pre-started isolated workers per task version, so a triggered run pays neither the
interpreter's start-up nor its imports nor loading the task's model (Walle's tailored VM keeps tasks warm).

Each worker is started from the same `container.Launch` as a cold run, so it is isolated alike: its own uid,
mount view (task files read-only, a private scratch), cgroup, seccomp filter and rlimits. What differs is
its life: it serves the runs of one task version one after another (state a task keeps between its own runs
stays within that task version, as in Walle), and is killed when a run overstays its time limit, when it
crashes (the run is reported as a crash and a fresh worker replaces it), after `MAX_RUNS` runs, or when the
version retires. After each run the worker kills every other process of the run's identity, so nothing a
run started outlives it (warm_worker.py). At most `max_concurrency` runs go at once, over all tasks.

Each version folder has its own spawner thread: a task whose module takes a minute to import delays only
its own workers, never another task's first run.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from edgerun.fleet.container import (
    CANCELLED_ERROR,
    MAX_RESULT_BYTES,
    TAIL_BYTES,
    Launch,
    Limits,
    RunResult,
)

WARM_WORKER = Path(__file__).with_name("warm_worker.py")
MAX_RUNS = 1000     # runs one worker serves before a fresh one replaces it
STARTUP_S = 60.0    # imports and the task's module-level set-up (a model load) must finish within this
LaunchFactory = Callable[[Path, str, Limits], Launch]


class WarmWorker:
    """One pre-started worker of one task version."""

    def __init__(self, launch: Launch, limits: Limits, *, wait: bool = True) -> None:
        """Start the worker; with `wait`, also wait for its ready frame (else call `wait_ready`)."""
        self.launch, self.limits = launch, limits
        self.startup_ms = 0.0
        self.runs = 0
        self.startup_error = ""
        self._buf = bytearray()
        self._tails = {"stdout": bytearray(), "stderr": bytearray()}
        result_r, result_w = os.pipe()
        spec = {**launch.spec, "result_fd": result_w, "max_runs": MAX_RUNS}
        start = time.perf_counter()
        try:
            self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [*launch.prefix, *launch.worker, json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, env=launch.env, cwd=launch.cwd, pass_fds=(result_w, *launch.extra_fds),
                start_new_session=True, preexec_fn=launch.cgroup.enter if launch.cgroup is not None else None)
        except OSError as exc:
            os.close(result_r)
            self.proc, self.startup_error = None, f"cannot start the container: {exc}"
            return
        finally:
            os.close(result_w)
        self._result_r = result_r
        self._started = start
        for name, pipe in (("stdout", self.proc.stdout), ("stderr", self.proc.stderr)):
            threading.Thread(target=self._drain, args=(pipe, self._tails[name]), daemon=True).start()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait for the ready frame (imports and the task's module-level set-up); a worker that does not
        send one in time is closed, with `startup_error` saying why."""
        if self.proc is None:
            return
        status, record = self._read_frame(self._started + max(STARTUP_S, self.limits.timeout_s))
        if status != "frame" or not record.get("ready"):
            self.startup_error = (str(record.get("error", "")) if status == "frame" else
                                  f"the warm worker did not start ({status}): {self._tail('stderr')}")
            self.close()
        self.startup_ms = (time.perf_counter() - self._started) * 1000

    def kill(self) -> None:
        """SIGKILL the worker's process group from any thread; the thread waiting on it then closes it."""
        proc = self.proc
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def run(self, inputs: Any, cancel: threading.Event | None = None) -> RunResult:
        """One run; never raises for the task's faults. A worker that is not alive afterwards is discarded.
        Setting `cancel` stops the run at once (the worker is killed; outcome `cancelled`)."""
        assert self.proc is not None and self.proc.stdin is not None
        start = time.perf_counter()
        payload = json.dumps({"inputs": inputs}).encode()
        try:
            self.proc.stdin.write(len(payload).to_bytes(8, "big") + payload)
            self.proc.stdin.flush()
        except OSError:
            pass  # it died while idle: read what it left below
        self.runs += 1
        status, record = self._read_frame(start + self.limits.timeout_s, cancel)
        latency = (time.perf_counter() - start) * 1000
        if status == "cancelled" or (status != "frame" and cancel is not None and cancel.is_set()):
            self.close()
            return self._done(RunResult("cancelled", latency,
                                        error=CANCELLED_ERROR))
        if status == "timeout":
            self.close()
            return self._done(RunResult("timeout", latency, error=f"exceeded {self.limits.timeout_s:g}s"))
        if status != "frame":
            code = self._exit_code()
            self.close()
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"exited {code}"
            return self._done(RunResult("crash", latency, error=f"warm worker {how} without a result: "
                                                                 f"{self._tail('stderr')}"))
        if record.get("ok") is True:
            result = RunResult("success", latency, output=record.get("output"))
        elif record.get("ok") is False:
            result = RunResult("failure", latency, error=str(record.get("error", ""))[-2000:])
        else:
            self.close()
            result = RunResult("crash", latency, error="warm worker sent a malformed result")
        result.extra["stdout_tail"] = self._tail("stdout")
        if self.runs >= MAX_RUNS:
            self.close()
        return self._done(result)

    def _done(self, result: RunResult) -> RunResult:
        result.extra.update(isolation=self.launch.level, seccomp=self.launch.seccomp_fd is not None, warm=True)
        return result

    def _exit_code(self) -> int | None:
        assert self.proc is not None
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.proc.wait(2)
        return None

    def _read_frame(self, deadline: float, cancel: threading.Event | None = None) -> tuple[str, dict[str, Any]]:
        """("frame", record), ("timeout", {}), ("cancelled", {}), ("eof", {}) or ("malformed", {})."""
        with selectors.DefaultSelector() as sel:
            sel.register(self._result_r, selectors.EVENT_READ)
            while True:
                if len(self._buf) >= 8:
                    size = int.from_bytes(self._buf[:8], "big")
                    if size > MAX_RESULT_BYTES:
                        return "malformed", {}
                    if len(self._buf) >= 8 + size:
                        body, self._buf = bytes(self._buf[8:8 + size]), self._buf[8 + size:]
                        try:
                            record = json.loads(body)
                        except ValueError:
                            return "malformed", {}
                        return ("frame", record) if isinstance(record, dict) else ("malformed", {})
                left = deadline - time.perf_counter()
                if left <= 0:
                    return "timeout", {}
                if cancel is not None and cancel.is_set():
                    return "cancelled", {}
                if not sel.select(timeout=min(left, 0.1) if cancel is not None else left):
                    continue
                chunk = os.read(self._result_r, 1 << 16)
                if not chunk:
                    return "eof", {}
                self._buf += chunk

    @staticmethod
    def _drain(pipe: Any, tail: bytearray) -> None:
        with contextlib.suppress(OSError, ValueError):
            while chunk := pipe.read1(1 << 16):
                tail += chunk
                del tail[: max(0, len(tail) - TAIL_BYTES)]

    def _tail(self, name: str) -> str:
        return bytes(self._tails[name]).decode(errors="replace")

    def close(self) -> None:
        """Kill the worker and everything it started, and undo its launch (uid, cgroup, scratch)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
                with contextlib.suppress(OSError):
                    pipe.close()  # type: ignore[union-attr]
            os.close(self._result_r)
            self.proc = None
            self.launch.release()


class WarmPool:
    """Idle warm workers per task version folder; a run takes one (or starts one), and a worker a run
    killed is replaced in the background."""

    def __init__(self, launch_for: LaunchFactory, *, max_concurrency: int = 4, per_version: int = 1) -> None:
        self.launch_for = launch_for
        self.per_version = per_version
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._idle: dict[Path, list[WarmWorker]] = {}
        self._lock = threading.Lock()
        self.replaced = 0  # workers discarded after a crash or timeout and started anew
        # Workers are started by long-lived threads, one per version folder: bubblewrap's --die-with-parent
        # kills a worker when the *thread* that started it ends, and a run's or a prestart's thread soon
        # does; one thread per folder, so a slow start-up holds up only its own task.
        self._spawners: dict[Path, _Spawner] = {}
        self._starting: set[WarmWorker] = set()  # killed by close() while they start

    def _submit(self, folder: Path, fn: Callable[[], Any]) -> Future[Any]:
        with self._lock:
            spawner = self._spawners.get(folder)
            if spawner is None:
                spawner = self._spawners[folder] = _Spawner(f"warm-spawner-{folder.parent.name}-{folder.name}")
        return spawner.submit(fn)

    def _new_worker(self, folder: Path, entry: str, limits: Limits) -> WarmWorker:
        """Start one worker and wait for it to be ready (on the folder's spawner thread)."""
        worker = WarmWorker(self.launch_for(folder, entry, limits), limits, wait=False)
        with self._lock:
            self._starting.add(worker)
        try:
            worker.wait_ready()
        finally:
            with self._lock:
                self._starting.discard(worker)
        return worker

    def _start(self, folder: Path, entry: str, limits: Limits) -> WarmWorker:
        worker: WarmWorker = self._submit(folder, lambda: self._new_worker(folder, entry, limits)).result()
        return worker

    def prestart(self, folder: Path, entry: str, limits: Limits, *, wait: bool = False) -> None:
        """Start this version's workers before its first trigger (in the background unless `wait`)."""
        def fill() -> None:
            with self._lock:
                missing = self.per_version - len(self._idle.get(folder, []))
            for _ in range(missing):
                worker = self._new_worker(folder, entry, limits)
                if worker.alive:
                    self._give(folder, worker)
        done = self._submit(folder, fill)
        if wait:
            done.result()

    def _take(self, folder: Path) -> WarmWorker | None:
        with self._lock:
            idle = self._idle.get(folder, [])
            while idle:
                worker = idle.pop()
                if worker.alive:
                    return worker
                worker.close()
        return None

    def _give(self, folder: Path, worker: WarmWorker) -> None:
        with self._lock:
            if folder.exists():
                self._idle.setdefault(folder, []).append(worker)
                return
        worker.close()  # the version was pruned meanwhile

    def run(self, folder: Path, entry: str, limits: Limits, inputs: Any,
            cancel: threading.Event | None = None) -> RunResult:
        with self._slots:
            worker = self._take(folder)
            if worker is None:
                worker = self._start(folder, entry, limits)  # nothing warm: this run pays the start-up
                if cancel is not None and cancel.is_set():  # replaced while its worker started
                    worker.close()
                    return RunResult("cancelled", worker.startup_ms,
                                     error=CANCELLED_ERROR)
                if not worker.alive:
                    return RunResult("failure", worker.startup_ms, error=f"not run: {worker.startup_error[-2000:]}")
            result = worker.run(inputs, cancel)
            if worker.alive:
                self._give(folder, worker)
            else:
                self.replaced += 1
                result.extra["worker_replaced"] = True
                self.prestart(folder, entry, limits)
            return result

    def retire(self, keep: Callable[[Path], bool]) -> None:
        """Close the idle workers of every version folder `keep` rejects (deactivated or pruned)."""
        with self._lock:
            gone = [f for f in self._idle if not keep(f)]
            workers = [w for f in gone for w in self._idle.pop(f)]
            spawners = [self._spawners.pop(f) for f in list(self._spawners) if not keep(f)]
        for w in workers:
            w.close()
        for spawner in spawners:
            spawner.stop()

    def close(self) -> None:
        with self._lock:
            starting = list(self._starting)
        for w in starting:
            w.kill()  # its spawner thread sees it die and closes it
        self.retire(lambda _folder: False)


class _Spawner:
    """One long-lived thread that runs start-up jobs in order (see WarmPool.__init__ for why a thread)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[tuple[Callable[[], Any], Future[Any]] | None] = queue.Queue()
        threading.Thread(target=self._loop, name=name, daemon=True).start()

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, future = job
            try:
                future.set_result(fn())
            except BaseException as exc:  # handed to whoever waits on it
                future.set_exception(exc)

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((fn, future))
        return future

    def stop(self) -> None:
        self._jobs.put(None)  # after the jobs already queued
