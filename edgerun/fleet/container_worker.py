"""Worker process of the compute container (run by path with `python -I`; imports nothing from edgerun).

argv[1]: JSON spec {"task_dir", "entry", "result_fd", "uid", "limits": {...}}; stdin: JSON inputs.
Before any task code runs it sets the rlimits, drops to the run's own uid (when started as root) and sets
no_new_privs, so nothing the task executes can gain privileges. It then calls `run(inputs)` from the entry
and writes one frame, 8-byte big-endian length + JSON {"ok": true, "output": ...} or {"ok": false,
"error": "..."}, to the result pipe. The task's stdout and stderr are separate pipes. The agent decides
the outcome from what it observes (exit status, signal, wall clock, one well-formed frame), so a task can
at most claim its own return value, which it could do by returning it.
"""

import json
import os
import pkgutil  # noqa: F401 - runpy needs it; imported before the uid drop, which may hide the stdlib
import resource
import runpy
import sys
import traceback

_PR_SET_NO_NEW_PRIVS = 38
_MIB = 1024 * 1024


def _limit(which: int, value: int) -> None:
    resource.setrlimit(which, (value, value))


def confine(spec: dict) -> None:
    limits = spec["limits"]
    libc = None
    if spec.get("set_no_new_privs", True):  # bubblewrap has already set it for everything it starts
        import ctypes  # before the uid drop, which may hide the standard library

        libc = ctypes.CDLL(None, use_errno=True)
    _limit(resource.RLIMIT_CORE, 0)
    _limit(resource.RLIMIT_AS, int(limits["memory_mb"]) * _MIB)
    _limit(resource.RLIMIT_CPU, int(limits["cpu_s"]))
    _limit(resource.RLIMIT_NOFILE, int(limits["open_files"]))
    _limit(resource.RLIMIT_FSIZE, int(limits["scratch_mb"]) * _MIB)
    if spec.get("limit_nproc"):
        # Counted per uid (per user namespace): it bounds this run alone only where its uid or namespace is
        # its own; the container asks for it only then, not for a non-root agent's shared uid.
        _limit(resource.RLIMIT_NPROC, int(limits["processes"]))
    uid = spec.get("uid")
    if uid is not None and os.geteuid() == 0:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if libc is not None and libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")


def main() -> int:
    spec = json.loads(sys.argv[1])
    task_dir, entry, result_fd = spec["task_dir"], spec["entry"], int(spec["result_fd"])
    inputs = json.loads(sys.stdin.buffer.read() or b"null")
    confine(spec)
    sys.path[:0] = [task_dir, *spec.get("python_path", [])]
    os.chdir(task_dir)
    try:
        namespace = runpy.run_path(os.path.join(task_dir, entry), run_name="__edgerun_task__")
        output = namespace["run"](inputs)
        payload = json.dumps({"ok": True, "output": output}).encode()
        code = 0
    except BaseException:  # the task's own fault, whatever it is, becomes a failure report
        payload = json.dumps({"ok": False, "error": traceback.format_exc(limit=5)}).encode()
        code = 1
    with os.fdopen(result_fd, "wb") as out:
        out.write(len(payload).to_bytes(8, "big") + payload)
    return code


if __name__ == "__main__":
    sys.exit(main())
