"""The compute container: each task run is a fresh worker process, isolated at the device's level (sandbox.py).

A crashing, hanging, memory-hungry or hostile task affects only its own run: it sees only its own files
(read-only) and a size-limited scratch, runs as its own unprivileged uid, has no network unless its signed
config asks, and every process it started is killed when the run ends. The agent reads the outcome from
what it observes and from one framed result on a pipe it owns; the task's stdout and stderr are kept apart.
(Walle runs tasks in per-thread interpreters inside the app; CPython 3.11 has no per-interpreter GIL,
so a process is the honest boundary, and Linux namespaces and cgroups make it a real one.)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgerun.fleet.sandbox import bwrap_command, detect_level, package_root, run_uid
from edgerun.fleet.sandbox_cgroup import RunCgroup, sweep_stale
from edgerun.fleet.sandbox_seccomp import filter_fd

WORKER = Path(__file__).with_name("container_worker.py")
# "cancelled": stopped by the agent because a newer assignment replaced or removed the task's version, or
# because the agent itself is stopping (agent.py); a cancelled run never counts toward quarantine.
OUTCOMES = ("success", "failure", "timeout", "crash", "cancelled")
CANCELLED_ERROR = "cancelled by the agent: a newer assignment replaced the version, or the agent stopped"
MAX_RESULT_BYTES = 16 * 1024 * 1024  # a bigger result is a crash, not a reason for the agent to grow
TAIL_BYTES = 4000  # of the task's stdout and stderr, kept for the report


@dataclass(frozen=True)
class Limits:
    """Per-run limits (task.json `limits`); validated there (task_schema.py)."""

    timeout_s: float = 10.0
    memory_mb: int = 512
    processes: int = 32
    open_files: int = 256
    scratch_mb: int = 64
    cpu_s: float | None = None  # default: the wall-time limit

    @classmethod
    def from_config(cls, limits: dict[str, Any]) -> Limits:
        known = {k: limits[k] for k in ("timeout_s", "memory_mb", "processes", "open_files", "scratch_mb", "cpu_s")
                 if k in limits}
        return cls(**known)

    def as_worker_spec(self) -> dict[str, int]:
        cpu = self.cpu_s if self.cpu_s is not None else self.timeout_s
        return {"memory_mb": int(self.memory_mb), "processes": int(self.processes),
                "open_files": int(self.open_files), "scratch_mb": int(self.scratch_mb),
                "cpu_s": max(1, math.ceil(cpu))}


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


def run_in_container(task_dir: str | Path, entry: str, inputs: Any, *, timeout_s: float = 10.0,
                     memory_mb: int = 512, limits: Limits | None = None, network: bool = False,
                     work_root: str | Path | None = None, level: str | None = None,
                     hide: list[Path] | None = None, readonly_shares: list[Path] | None = None,
                     extra_env: dict[str, str] | None = None, cancel: threading.Event | None = None) -> RunResult:
    """Run `run(inputs)` from `entry` in `task_dir` once, isolated; never raises for task faults.

    `limits` overrides `timeout_s`/`memory_mb`. `hide` names folders that must never be visible (the agent's
    state); `readonly_shares` are files shared read-only at their own path (collective storage, the device's
    search cache); `extra_env` adds environment variables (EDGERUN_CACHE_DIR naming that cache). Where a
    folder is needed on the host (rlimit-only level) it goes under `work_root`, so a run cut short by
    kill -9 leaves its leftovers where the next start sweeps them (`clear_scratch`). Setting `cancel` stops
    the run at once (every process of it killed; outcome `cancelled`).
    """
    limits = limits or Limits(timeout_s=timeout_s, memory_mb=memory_mb)
    launch = Launch.prepare(task_dir, entry, limits, network=network, work_root=work_root, level=level,
                            hide=hide, readonly_shares=readonly_shares, extra_env=extra_env)
    start = time.perf_counter()
    try:
        result = _spawn_and_watch(launch.prefix, launch.worker, launch.spec, launch.env, launch.cwd, inputs,
                                  limits.timeout_s, launch.cgroup, start, extra_fds=launch.extra_fds, cancel=cancel)
    finally:
        result_extra = launch.release()
    result.extra.update(isolation=launch.level, seccomp=launch.seccomp_fd is not None, **result_extra)
    if result.extra.get("oom_killed") and result.outcome == "crash":
        result.error = f"the run's processes together exceeded memory_mb={limits.memory_mb}; {result.error}"
    return result


@dataclass
class Launch:
    """Everything one isolated worker process is started with, and what must be undone after it: the
    bubblewrap prefix, the run's own uid, cgroup, seccomp filter and (without a mount namespace) scratch
    folder. A cold run and a warm worker (warm_pool.py) are started from the same Launch, so they are
    isolated alike."""

    level: str
    prefix: list[str]
    worker: list[str]
    spec: dict[str, Any]
    env: dict[str, str]
    cwd: str | None
    uid: int | None
    cgroup: RunCgroup | None
    seccomp_fd: int | None
    scratch_host: Path | None

    @property
    def extra_fds(self) -> tuple[int, ...]:
        return (self.seccomp_fd,) if self.seccomp_fd is not None else ()

    @classmethod
    def prepare(cls, task_dir: str | Path, entry: str, limits: Limits, *, network: bool = False,
                work_root: str | Path | None = None, level: str | None = None, hide: list[Path] | None = None,
                readonly_shares: list[Path] | None = None, extra_env: dict[str, str] | None = None,
                worker_script: Path = WORKER) -> Launch:
        level = level or detect_level()
        task_dir = Path(task_dir).resolve()
        uid = run_uid()
        cgroup = RunCgroup.create(limits.memory_mb, limits.processes) if level.endswith("cgroup") else None
        if level.endswith("cgroup") and cgroup is None:
            level = "bwrap+rlimit" if level.startswith("bwrap") else "rlimit-only"
        scratch_host: Path | None = None
        seccomp_fd = filter_fd() if level.startswith("bwrap") else None
        if level.startswith("bwrap"):
            prefix, plan = bwrap_command(task_dir, worker_script, scratch_mb=limits.scratch_mb, network=network,
                                         hide=list(hide or []), readonly_shares=list(readonly_shares or []),
                                         seccomp_fd=seccomp_fd)
            run_dir, worker, cwd = plan.task_dir, plan.worker, None
        else:
            prefix, run_dir, worker = [], str(task_dir), str(worker_script)
            scratch_host = _make_scratch(work_root, uid)
            cwd = str(scratch_host)
        spec = {"task_dir": run_dir, "entry": entry, "uid": uid, "limits": limits.as_worker_spec(),
                "python_path": [str(package_root())], "set_no_new_privs": not level.startswith("bwrap"),
                "limit_nproc": uid is not None or level.startswith("bwrap"),
                # A warm worker may SIGKILL every other process of its identity after each run only where
                # that identity is the run's own (its uid, or bubblewrap's pid namespace): warm_worker.py.
                "own_identity": uid is not None or level.startswith("bwrap")}
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
               "PYTHONDONTWRITEBYTECODE": "1", **(extra_env or {})}
        if scratch_host is not None:
            env.update(HOME=str(scratch_host), TMPDIR=str(scratch_host))
        return cls(level, prefix, [sys.executable, "-I", worker], spec, env, cwd, uid, cgroup, seccomp_fd,
                   scratch_host)

    def release(self) -> dict[str, Any]:
        """Kill whatever is left of the worker and undo the launch; returns the cgroup's figures."""
        if self.seccomp_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self.seccomp_fd)
        if self.uid is not None and not self.level.startswith("bwrap"):
            _kill_uid(self.uid)  # no pid namespace: every process of the run's own uid goes
        extra: dict[str, Any] = {}
        if self.cgroup is not None:
            extra = {"peak_memory_mb": round(self.cgroup.peak_memory_bytes() / 2**20, 1),
                     "oom_killed": self.cgroup.oom_killed()}
            self.cgroup.kill_all()
            self.cgroup.remove()
        if self.scratch_host is not None:
            shutil.rmtree(self.scratch_host, ignore_errors=True)
        return extra


def _make_scratch(work_root: str | Path | None, uid: int | None) -> Path:
    root = Path(work_root) if work_root is not None else Path("/tmp")
    root.mkdir(parents=True, exist_ok=True)
    scratch = root / f"edgerun-run-{os.getpid()}-{time.monotonic_ns()}"
    scratch.mkdir(mode=0o700)
    if uid is not None:
        os.chown(scratch, uid, uid)
    return scratch


def _spawn_and_watch(prefix: list[str], worker: list[str], spec: dict[str, Any], env: dict[str, str],
                     cwd: str | None, inputs: Any, timeout_s: float, cgroup: RunCgroup | None,
                     start: float, extra_fds: tuple[int, ...] = (),
                     cancel: threading.Event | None = None) -> RunResult:
    result_r, result_w = os.pipe()  # the agent's end stays here; the task never sees the agent's side
    command = [*prefix, *worker, json.dumps({**spec, "result_fd": result_w})]
    try:
        proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                env=env, cwd=cwd, pass_fds=(result_w, *extra_fds), start_new_session=True,
                                preexec_fn=cgroup.enter if cgroup is not None else None)
    except OSError as exc:
        os.close(result_r)
        os.close(result_w)
        return RunResult("crash", 0.0, error=f"cannot start the container: {exc}")
    os.close(result_w)
    threading.Thread(target=_feed, args=(proc.stdin, json.dumps(inputs).encode()), daemon=True).start()
    out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()  # type: ignore[union-attr]
    streams = {out_fd: bytearray(), err_fd: bytearray(), result_r: bytearray()}
    stopped = _pump(proc, streams, result_r, deadline=start + timeout_s, cancel=cancel)
    latency = (time.perf_counter() - start) * 1000
    if stopped:
        _kill_tree(proc)
    code = proc.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # children still in its session (all a non-root rlimit run can do)
    os.close(result_r)
    proc.stdout.close()  # type: ignore[union-attr]
    proc.stderr.close()  # type: ignore[union-attr]
    stdout_tail, stderr_tail = (bytes(streams[fd]).decode(errors="replace") for fd in (out_fd, err_fd))
    if stopped == "cancelled":
        return RunResult("cancelled", latency, error=CANCELLED_ERROR)
    if stopped:
        return RunResult("timeout", latency, error=f"exceeded {timeout_s:g}s")
    if code < 0 or code > 128:
        sig = -code if code < 0 else code - 128
        return RunResult("crash", latency, error=f"worker killed by signal {sig}: {stderr_tail}")
    record = _parse_frame(bytes(streams[result_r]))
    if record is None or code not in (0, 1) or bool(record.get("ok")) != (code == 0):
        return RunResult("crash", latency, error=f"worker exited {code} without a result: {stderr_tail}")
    out = RunResult("success", latency, output=record.get("output")) if record.get("ok") else \
        RunResult("failure", latency, error=str(record.get("error", ""))[-2000:])
    out.extra["stdout_tail"] = stdout_tail
    return out


def _feed(pipe: Any, data: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        pipe.write(data)
        pipe.close()


def _pump(proc: subprocess.Popen[bytes], streams: dict[int, bytearray], result_fd: int, deadline: float,
          cancel: threading.Event | None = None) -> str:
    """Read stdout, stderr and the result pipe until the worker ends; "timeout" if the deadline passed
    first, "cancelled" if `cancel` was set first, else "".

    stdout and stderr keep only their tails; the result pipe stops growing past MAX_RESULT_BYTES + 1, which
    _parse_frame refuses. The worker's exit ends the wait even if a (soon killed) child holds a pipe open.
    """
    sel = selectors.DefaultSelector()
    for fd in streams:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    try:
        while sel.get_map():
            now = time.perf_counter()
            if now >= deadline:
                return "timeout"
            if cancel is not None and cancel.is_set():
                return "cancelled"
            exited = proc.poll() is not None
            for key, _ in sel.select(timeout=0.02 if exited else min(0.1, deadline - now)):
                fd = int(key.fd)  # type: ignore[arg-type]
                try:
                    chunk = os.read(fd, 1 << 16)
                except BlockingIOError:
                    continue
                if not chunk:
                    sel.unregister(fd)
                    continue
                buf = streams[fd]
                if fd == result_fd:
                    buf += chunk[: MAX_RESULT_BYTES + 9 - len(buf)]
                else:
                    buf += chunk
                    del buf[: max(0, len(buf) - TAIL_BYTES)]
            if exited and not any(sel.select(timeout=0)):
                break
        return ""
    finally:
        sel.close()


def _parse_frame(frame: bytes) -> dict[str, Any] | None:
    if len(frame) < 8:
        return None
    size = int.from_bytes(frame[:8], "big")
    if size > MAX_RESULT_BYTES or len(frame) != 8 + size:
        return None  # truncated, oversized, or more than one frame
    try:
        record = json.loads(frame[8:])
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def _kill_tree(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the worker leads its own session (start_new_session)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


# Run in a fresh interpreter: it takes the run's uid, then SIGKILLs every other process of that uid (kill(-1)
# spares the caller) until none is left.
_KILL_UID = ("import os, signal, sys\n"
             "uid = int(sys.argv[1])\n"
             "os.setresuid(uid, uid, uid)\n"
             "for _ in range(20):\n"
             "    try:\n"
             "        os.kill(-1, signal.SIGKILL)  # as this uid: reaches only this uid's processes\n"
             "    except ProcessLookupError:\n"
             "        break\n")
KILL_UID_TIMEOUT_S = 10.0


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (fresh per run): a child that left the session dies too.

    Done by a new process (fork and exec), not a bare fork of this one: the agent is multi-threaded (task
    threads, ONNX Runtime's pools), and a forked copy of it that changes uid can wait forever on glibc's
    set-id handshake with threads that did not survive the fork (a CI run hung with the agent in this
    waitpid; inferred, the stack was not read). The exec'd interpreter is single-threaded."""
    proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _KILL_UID, str(uid)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=KILL_UID_TIMEOUT_S)
    except subprocess.TimeoutExpired:  # never hold the agent up: the uid's leftovers die with the next run's sweep
        proc.kill()
        proc.wait()


def clear_scratch(work_root: str | Path) -> None:
    """Remove scratch folders and empty cgroups of runs that a crash interrupted (called at agent start)."""
    sweep_stale()
    root = Path(work_root)
    if root.is_dir():
        for leftover in root.glob("edgerun-run-*"):
            shutil.rmtree(leftover, ignore_errors=True)
