"""The agent's loop does not wait for its tasks, and warm workers do not wait for each other: an abort
reaches a device whose task hangs (scheduled or triggered by the stream pipeline) and stops that task; a task that takes minutes to import does not hold
up another task's first run; nothing a warm run started outlives it; SIGTERM stops the agent cleanly
(docs/security.md, rows D17-D19, D21, D22)."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fleet_helpers import REPO, FleetServer, make_task, token_file

from edgerun.fleet.container import Launch, Limits
from edgerun.fleet.sandbox import detect_level
from edgerun.fleet.warm_pool import WARM_WORKER, WarmPool
from edgerun.stream.agent_hooks import STREAM_STATE_DIR, StreamHooks
from edgerun.stream.event_queue import EventEmitter

pytestmark = pytest.mark.xdist_group("fleet-agent")
LEVEL = detect_level()


def _others_may_import_numpy() -> bool:
    """At the rlimit levels a run's own uid imports numpy from the host's Python (no mount view): every
    folder on the way must be traversable by others (Debian's /usr is; a pyenv under /root is not)."""
    import _datetime  # numpy's C core imports it, from the interpreter's own lib-dynload

    import numpy

    paths = (Path(numpy.__file__).resolve(), Path(_datetime.__file__).resolve())
    return all(p.stat().st_mode & 0o001 for path in paths for p in path.parents)


LEVELS = [pytest.param(LEVEL, id=LEVEL), pytest.param("rlimit-only", id="rlimit-only", marks=pytest.mark.skipif(
    not _others_may_import_numpy(), reason="this Python lies in a folder other uids cannot traverse"))]


def wait_for(condition: Callable[[], object], what: str, limit_s: float = 60.0) -> None:
    """Poll until `condition` holds; the limit only keeps a broken build from hanging CI."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_an_abort_reaches_an_agent_whose_task_hangs_and_stops_the_task(shared_server: FleetServer, tmp_path: Path,
                                                                      warm: bool) -> None:
    device = task = f"hung-{'warm' if warm else 'cold'}"
    release = shared_server.admin().publish(
        make_task(tmp_path, task, 2, body="import time\ndef run(inputs):\n    time.sleep(3600)\n",
                  limits={"timeout_s": 3600}, schedule={"every_s": 0},
                  targeting={"kind": "device", "values": [device]}),
        shared_server.keys, {"steps": [100], "min_reports": 10**6})
    agent = shared_server.agent(device, tmp_path / "agent", checkin_interval_s=0.1, warm_workers=warm)
    stop = threading.Event()
    loop = threading.Thread(target=agent.run_forever, kwargs={"stop": stop}, daemon=True)
    loop.start()
    try:
        wait_for(lambda: agent._in_flight, "the scheduled run started")
        shared_server.admin().control(release["id"], "abort")  # reaches the device only by a check-in
        wait_for(lambda: shared_server.admin().device(device)["reports"], "the run was reported")
        assert shared_server.admin().device(device)["reports"] == {"cancelled": 1}
        assert task not in agent.profile().tasks and not agent._in_flight
    finally:
        stop.set()
        loop.join(30)
    assert not loop.is_alive()


def test_a_stream_triggered_task_that_hangs_holds_up_no_check_in_and_an_abort_stops_it(
        shared_server: FleetServer, tmp_path: Path) -> None:
    device = task = "stream-hung"
    release = shared_server.admin().publish(
        make_task(tmp_path, task, 1, body="import time\ndef run(inputs):\n    time.sleep(3600)\n",
                  limits={"timeout_s": 3600}, triggers=[{"sequence": ["click.buy"]}],
                  targeting={"kind": "device", "values": [device]}),
        shared_server.keys, {"steps": [100], "min_reports": 10**6})
    agent = shared_server.agent(device, tmp_path / "agent", checkin_interval_s=0.1)
    hooks = agent.hooks = StreamHooks.for_agent(agent)
    checkins: list[str] = []  # the check-in requests the agent sends, seen on its own HTTP client
    agent.http.event_hooks["request"].append(
        lambda request: checkins.append(request.url.path) if request.url.path.endswith("/checkin") else None)
    stop = threading.Event()
    loop = threading.Thread(target=agent.run_forever, kwargs={"stop": stop}, daemon=True)
    loop.start()
    try:
        wait_for(lambda: hooks.pipeline.trie.task_ids == [task], "the task's trigger was registered")
        EventEmitter(agent.state_dir / STREAM_STATE_DIR).emit("click", "item", event_id="click.buy")
        wait_for(lambda: agent._in_flight, "the triggered run started")
        during = len(checkins)
        wait_for(lambda: len(checkins) >= during + 3 and agent._in_flight, "check-ins during the run")
        shared_server.admin().control(release["id"], "abort")  # reaches the device only by a check-in
        wait_for(lambda: shared_server.admin().device(device)["reports"], "the run was reported")
        assert shared_server.admin().device(device)["reports"] == {"cancelled": 1}
        assert task not in agent.profile().tasks and not agent._in_flight and not hooks.pipeline.trie.task_ids
    finally:
        stop.set()
        loop.join(30)
        hooks.close()
        agent.close()
    assert not loop.is_alive()


_made: list[Path] = []


@pytest.fixture(autouse=True)
def _remove_task_folders() -> Iterator[None]:
    yield
    while _made:
        path = _made.pop()
        for p in sorted(path.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        path.rmdir()


def version_folder(body: str) -> Path:
    """`<tmp>/<task>/1/main.py`, traversable by a run's own uid (rlimit levels have no mount view)."""
    root = Path(tempfile.mkdtemp(prefix="edgerun-test-warm-"))
    root.chmod(0o755)
    _made.append(root)
    folder = root / "task" / "1"
    folder.mkdir(parents=True)
    for p in (root / "task", folder):
        p.chmod(0o755)
    (folder / "main.py").write_text(body)
    (folder / "main.py").chmod(0o644)
    return folder


def pool_at(level: str, scratch: Path) -> WarmPool:
    return WarmPool(lambda folder, entry, limits: Launch.prepare(folder, entry, limits, worker_script=WARM_WORKER,
                                                                 level=level, work_root=scratch))


def test_a_task_slow_to_import_does_not_hold_up_another_tasks_first_run(tmp_path: Path) -> None:
    slow = version_folder("import time\ntime.sleep(300)\ndef run(inputs):\n    return 0\n")
    honest = version_folder("def run(inputs):\n    return 'honest'\n")
    pool = pool_at(LEVEL, tmp_path / "scratch")
    try:
        pool.prestart(slow, "main.py", Limits(timeout_s=5))
        wait_for(lambda: pool._starting, "the slow worker is starting")
        result = pool.run(honest, "main.py", Limits(timeout_s=30), {})
        assert result.outcome == "success" and result.output == "honest", result.error
        assert pool._starting and not pool._idle.get(slow)  # the slow one is still importing
    finally:
        pool.close()
    wait_for(lambda: not pool._starting, "close() stopped the starting worker")


DETACH = r'''
import os
def run(inputs):
    # A grandchild in a new session, its parent gone: the classic daemon, here also one that re-forks.
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv("/bin/sh", ["/bin/sh", "-c", "while true; do sleep 1 & wait; done", inputs["marker"]])
        os._exit(0)
    os.wait()
    return {"detached": True}
'''


def processes_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


@pytest.mark.parametrize("level", LEVELS)
def test_nothing_a_warm_run_started_outlives_it(tmp_path: Path, level: str) -> None:
    marker = f"edgerun-warm-detached-{uuid.uuid4().hex}"
    folder = version_folder(DETACH)
    pool = pool_at(level, tmp_path / "scratch")
    try:
        result = pool.run(folder, "main.py", Limits(timeout_s=30), {"marker": marker})
        assert result.outcome == "success", result.error
        assert pool._idle.get(folder)  # the worker itself lives on for the next run
        wait_for(lambda: not processes_with(marker), "the detached child is gone", limit_s=10)
        again = pool.run(folder, "main.py", Limits(timeout_s=30), {"marker": marker})
        assert again.outcome == "success" and again.extra.get("warm")
    finally:
        pool.close()
        for pid in processes_with(marker):  # what an old build leaves behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_sigterm_stops_the_agent_with_its_running_task_reported_as_cancelled(shared_server: FleetServer,
                                                                             tmp_path: Path) -> None:
    """A stop by SIGTERM (systemd, a phone's OS) is not a crash: the run in progress ends as `cancelled`
    and is reported, instead of staying `running` and counting toward the version's quarantine."""
    device = task = "sigterm-dev"
    shared_server.admin().publish(
        make_task(tmp_path, task, 2, body="import time\ndef run(inputs):\n    time.sleep(3600)\n",
                  limits={"timeout_s": 3600}, schedule={"every_s": 0}, targeting={"kind": "device", "values": [device]}),
        shared_server.keys, {"steps": [100], "min_reports": 10**6, "error_min_reports": 10**6})
    state = tmp_path / "agent"
    enroll = token_file(tmp_path / "enroll", shared_server.enroll_token)
    proc = subprocess.Popen([sys.executable, "-m", "edgerun", "fleet", "agent", "--server", shared_server.url,
                             "--device-id", device, "--state", str(state), "--root",
                             str(shared_server.keys.latest_root_path()), "--enroll-token-file", str(enroll),
                             "--no-stream", "--no-push", "--interval", "0.2", "--quiet"],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def outbox() -> list[tuple[str, str | None]]:
        if not (state / "agent.db").exists():
            return []
        db = sqlite3.connect(state / "agent.db")
        try:
            return db.execute("SELECT state, outcome FROM outbox").fetchall()
        except sqlite3.OperationalError:  # the agent is still making its tables
            return []
        finally:
            db.close()

    try:
        wait_for(lambda: ("running", None) in outbox(), "the run started")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert outbox() == [("sent", "cancelled")]
    assert shared_server.admin().device(device)["reports"] == {"cancelled": 1}
