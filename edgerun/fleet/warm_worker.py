"""Warm worker of the compute container (run by path with `python -I`, like container_worker.py).

argv[1]: the same JSON spec as a cold run. It confines itself exactly as a cold worker does (rlimits, the
run's own uid, no_new_privs; bubblewrap, cgroup and seccomp come from the same launch), then pays what a
cold run pays on every trigger once: it imports numpy and edgerun and executes the task's entry, so a
model the script loads at import stays loaded. It writes a ready frame, then serves runs of this one task
version: stdin carries frames (8-byte big-endian length + JSON inputs), the result pipe one frame per run,
as a cold worker writes it. The agent kills it when a run overstays its limit or the version retires.

After each run, before its result frame, it SIGKILLs every other process its identity may signal
(`kill(-1)`): where that identity is the run's own (bubblewrap's pid namespace, or the run's own uid),
that is exactly what the run started, detached children included, so no process outlives its run.
"""

import json
import os
import pkgutil  # noqa: F401 - runpy needs it; imported before the uid drop, which may hide the stdlib
import resource
import runpy
import signal
import sys
import traceback

_CPU = resource.RLIMIT_CPU


def _frame(out, record: dict) -> None:
    payload = json.dumps(record).encode()
    out.write(len(payload).to_bytes(8, "big") + payload)
    out.flush()


def _read_frame(stream):
    head = stream.read(8)
    if len(head) < 8:
        return None
    size = int.from_bytes(head, "big")
    body = stream.read(size)
    return json.loads(body) if len(body) == size else None


def _kill_what_the_run_left() -> None:
    """SIGKILL every process of this worker's identity but itself (kill(-1) spares the caller and pid 1),
    then reap its own children. Killed processes stay zombies until reaped, so kill(-1) keeps finding them;
    the loop is bounded and each pass is one system call."""
    for _ in range(20):
        try:
            os.kill(-1, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            break
        try:
            while os.waitpid(-1, os.WNOHANG)[0] > 0:
                pass
        except ChildProcessError:
            pass


def main() -> int:
    spec = json.loads(sys.argv[1])
    sys.path[:0] = list(spec.get("python_path", []))
    from edgerun.fleet.container_worker import confine  # the agent's own package, read-only in the sandbox

    reap = bool(spec.get("own_identity"))
    per_run_cpu = int(spec["limits"]["cpu_s"])
    runs_allowed = int(spec.get("max_runs", 1000))
    # The CPU rlimit counts the process's whole life: the hard limit allows every run it may serve, and
    # each run gets its own soft limit; the wall clock, which the agent enforces, is the real bound.
    spec["limits"] = {**spec["limits"], "cpu_s": per_run_cpu * (runs_allowed + 1)}
    task_dir, entry = spec["task_dir"], spec["entry"]
    out = os.fdopen(int(spec["result_fd"]), "wb")
    confine(spec)
    sys.path[:0] = [task_dir]
    os.chdir(task_dir)
    try:
        import numpy  # noqa: F401 - what a cold run imports on every trigger

        import edgerun  # noqa: F401

        namespace = runpy.run_path(os.path.join(task_dir, entry), run_name="__edgerun_task__")
        run = namespace["run"]
    except BaseException:
        _frame(out, {"ok": False, "error": traceback.format_exc(limit=5)})
        return 1
    _frame(out, {"ready": True})
    stdin = sys.stdin.buffer
    for _ in range(runs_allowed):
        inputs = _read_frame(stdin)
        if inputs is None:
            return 0  # the agent closed the pipe: retired
        used = resource.getrusage(resource.RUSAGE_SELF)
        soft = int(used.ru_utime + used.ru_stime) + per_run_cpu
        resource.setrlimit(_CPU, (soft, resource.getrlimit(_CPU)[1]))
        try:
            record = {"ok": True, "output": run(inputs["inputs"])}
            json.dumps(record)  # an unserialisable result is the task's fault, as in a cold run
        except BaseException:
            record = {"ok": False, "error": traceback.format_exc(limit=5)}
        if reap:
            _kill_what_the_run_left()
        _frame(out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
