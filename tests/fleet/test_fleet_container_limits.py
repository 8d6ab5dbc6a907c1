"""Hostile task code against the container's limits: detached children, fork bombs, memory spread over
children, the network; plus `edgerun task run`. Each test runs real task code that tries the escape."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_helpers import REPO

from edgerun.fleet.container import Limits, clear_scratch, run_in_container
from edgerun.fleet.sandbox import detect_level
from edgerun.fleet.sandbox_cgroup import RunCgroup
from edgerun.fleet.sandbox_seccomp import seccomp_filter

LEVEL = detect_level()
needs_bwrap = pytest.mark.skipif(not LEVEL.startswith("bwrap"),
                                 reason=f"bubblewrap is not usable here (level {LEVEL}): apt-get install bubblewrap")
needs_cgroup = pytest.mark.skipif(not LEVEL.endswith("cgroup"),
                                  reason=f"no writable cgroup (memory + pids) here (level {LEVEL})")
# The strongest level here, and the fallback every device has; root runs each task under its own uid in both.
LEVELS = [pytest.param(LEVEL, id=LEVEL), pytest.param("rlimit-only", id="rlimit-only")]


_made: list[Path] = []


@pytest.fixture(autouse=True)
def _remove_task_folders() -> Iterator[None]:
    yield
    while _made:
        shutil.rmtree(_made.pop(), ignore_errors=True)


def task(tmp_path: Path, body: str) -> Path:
    # Without a private mount view (rlimit levels) the run's own uid must be able to reach its folder, and
    # pytest's tmp_path lies under a 0700 folder; so tasks go in a world-traversable folder of their own.
    d = Path(tempfile.mkdtemp(prefix="edgerun-test-task-"))
    d.chmod(0o755)
    _made.append(d)
    (d / "main.py").write_text(body)
    (d / "main.py").chmod(0o644)
    return d


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


DETACH = r'''
import os
def run(inputs):
    # A grandchild in a new session, its parent gone: the classic daemon that outlives a plain spawn.
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 30; true", inputs["marker"]])
        os._exit(0)
    os.wait()
    if inputs["hang"]:
        while True:
            pass
    return {"detached": True}
'''


@pytest.mark.parametrize("hang", [False, True], ids=["returns", "times-out"])
@pytest.mark.parametrize("level", LEVELS)
def test_a_detached_child_does_not_outlive_its_run(tmp_path: Path, level: str, hang: bool) -> None:
    marker = f"edgerun-detached-{uuid.uuid4().hex}"
    r = run_in_container(task(tmp_path, DETACH), "main.py", {"marker": marker, "hang": hang}, level=level,
                         limits=Limits(timeout_s=1.5 if hang else 10), work_root=tmp_path / "scratch")
    assert r.outcome == ("timeout" if hang else "success"), r.error
    deadline = time.monotonic() + 3
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker) == []


FORK_BOMB = r'''
import os, time
def run(inputs):
    ok = 0
    for _ in range(50):
        try:
            pid = os.fork()
        except OSError:
            continue
        if pid == 0:
            time.sleep(2)
            os._exit(0)
        ok += 1
    return {"forked": ok}
'''


@pytest.mark.parametrize("level", LEVELS)
def test_fifty_forks_stop_at_the_process_limit(tmp_path: Path, level: str) -> None:
    limits = Limits(timeout_s=10, processes=16)
    r = run_in_container(task(tmp_path, FORK_BOMB), "main.py", {}, limits=limits, level=level,
                         work_root=tmp_path / "scratch")
    assert r.outcome == "success", r.error
    assert r.output["forked"] < 16  # the worker itself counts as one of the 16


MEMORY_SPREAD = r'''
import os, time
def run(inputs):
    pids = []
    for _ in range(4):
        pid = os.fork()
        if pid == 0:
            block = bytearray(200 * 1024 * 1024)
            for i in range(0, len(block), 4096):  # touch every page: resident, not just reserved
                block[i] = 1
            time.sleep(1.5)  # all four hold their 200 MB at the same time
            os._exit(0)
        pids.append(pid)
    done = sum(1 for pid in pids if os.waitpid(pid, 0)[1] == 0)
    return {"children_that_held_200mb": done}
'''


@needs_cgroup
def test_memory_limit_covers_the_whole_process_tree(tmp_path: Path) -> None:
    r = run_in_container(task(tmp_path, MEMORY_SPREAD), "main.py", {}, limits=Limits(timeout_s=20, memory_mb=256),
                         level=LEVEL)
    # The OOM killer takes children (or the worker itself); never do all four hold 200 MB under 256 MB.
    if r.outcome == "success":
        assert r.output["children_that_held_200mb"] <= 1, r.output
    else:
        assert r.outcome == "crash", r.error
    assert r.extra["oom_killed"] is True
    assert r.extra["peak_memory_mb"] <= 256.5


NETWORK = r'''
import socket
def run(inputs):
    try:
        socket.create_connection(("127.0.0.1", inputs["port"]), timeout=2).close()
        return {"connected": True}
    except OSError as exc:
        return {"connected": False, "error": type(exc).__name__}
'''


@needs_bwrap
def test_no_network_unless_the_manifest_asks(tmp_path: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        folder = task(tmp_path, NETWORK)
        r = run_in_container(folder, "main.py", {"port": port}, level=LEVEL)
        assert r.output == {"connected": False, "error": "ConnectionRefusedError"}, r.error  # its own empty netns
        r = run_in_container(folder, "main.py", {"port": port}, level=LEVEL, network=True)
        assert r.output == {"connected": True}, r.error


SCRATCH = r'''
import os
def run(inputs):
    with open("/tmp/big", "wb") as f:
        try:
            for _ in range(64):
                f.write(b"\0" * (1 << 20))
        except OSError as exc:
            return {"written_mb": f.tell() >> 20, "error": type(exc).__name__}
    return {"written_mb": 64}
'''


@needs_bwrap
def test_scratch_is_writable_and_size_limited(tmp_path: Path) -> None:
    r = run_in_container(task(tmp_path, SCRATCH), "main.py", {}, limits=Limits(scratch_mb=8), level=LEVEL)
    assert r.outcome in ("success", "failure", "crash"), r.error
    if r.outcome == "success":
        assert r.output["written_mb"] <= 8
    else:  # RLIMIT_FSIZE sends SIGXFSZ before the tmpfs fills up
        assert "signal 25" in r.error or "File too large" in r.error, r.error


def test_task_run_cli_runs_a_folder_once_in_the_container(tmp_path: Path) -> None:
    folder = task(tmp_path, "import os\ndef run(i):\n    print('to stdout, not the result')\n"
                            "    return {'double': i['x'] * 2, 'uid': os.getuid()}\n")
    (folder / "task.json").write_text(json.dumps({"name": "clirun", "version": 1}))
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-m", "edgerun", "task", "run", str(folder), "--inputs", '{"x": 21}',
                        "--json", str(out)], capture_output=True, text=True, env=env, cwd=REPO, timeout=60)
    assert p.returncode == 0, p.stderr
    record = json.loads(out.read_text())
    assert record["outcome"] == "success" and record["output"]["double"] == 42
    assert record["isolation"] == LEVEL and record["stdout_tail"] == "to stdout, not the result\n"
    if os.geteuid() == 0:
        assert record["output"]["uid"] != 0
    (folder / "task.json").write_text(json.dumps({"name": "clirun", "version": 1, "limits": {"timeout_s": "nan"}}))
    p = subprocess.run([sys.executable, "-m", "edgerun", "task", "run", str(folder)], capture_output=True,
                       text=True, env=env, cwd=REPO, timeout=60)
    assert p.returncode == 1 and "limits.timeout_s must be" in p.stderr and "Traceback" not in p.stderr


FORGE = r'''
import os, json
def run(inputs):
    # Try to forge a success frame on every descriptor, then die: the agent must see a crash.
    payload = json.dumps({"ok": True, "output": "forged"}).encode()
    for fd in range(3, 64):
        try:
            os.write(fd, len(payload).to_bytes(8, "big") + payload)
        except OSError:
            pass
    os.kill(os.getpid(), 9)
'''


def test_a_forged_result_frame_does_not_turn_a_crash_into_a_success(tmp_path: Path) -> None:
    r = run_in_container(task(tmp_path, FORGE), "main.py", {}, level=LEVEL)
    assert r.outcome == "crash" and r.output is None, r


SYSCALLS = r'''
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
def call(name, *args):
    return "ok" if getattr(libc, name)(*args) >= 0 else os.strerror(ctypes.get_errno())
def run(inputs):
    return {"unshare_user": call("unshare", 0x10000000),  # a new user namespace: kernel attack surface
            "keyctl": call("syscall", 250, 0, 0, 0, 0),  # the kernel keyring is not namespaced (x86-64 number)
            "subprocess": subprocess.run(["/bin/true"]).returncode}  # ordinary fork and exec still work
'''


@needs_bwrap
@pytest.mark.skipif(seccomp_filter() is None, reason="libseccomp (libseccomp2) is not installed")
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the keyctl number in the task is x86-64's")
def test_seccomp_refuses_new_user_namespaces_and_the_keyring(tmp_path: Path) -> None:
    r = run_in_container(task(tmp_path, SYSCALLS), "main.py", {}, level=LEVEL)
    assert r.extra["seccomp"] is True
    assert r.output == {"unshare_user": "Operation not permitted", "keyctl": "Operation not permitted",
                        "subprocess": 0}, r.error


@needs_cgroup
def test_cgroups_left_by_a_killed_agent_are_swept_but_fresh_ones_kept(tmp_path: Path) -> None:
    left = RunCgroup.create(64, 4)  # as a kill -9 between create and remove leaves it
    fresh = RunCgroup.create(64, 4)  # made a moment ago by another run that has not entered it yet
    assert left is not None and fresh is not None
    for d in {left.memory_dir, left.pids_dir}:
        os.utime(d, (time.time() - 120, time.time() - 120))
    clear_scratch(tmp_path / "scratch")  # what the agent calls at start
    assert not left.memory_dir.exists() and not left.pids_dir.exists()
    assert fresh.memory_dir.exists() and fresh.pids_dir.exists()
    fresh.remove()
