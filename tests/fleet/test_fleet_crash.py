"""kill -9 of a running agent at random points: no half-activated task, no lost or doubled report."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import random
import signal
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import FleetServer, make_task

from edgerun.fleet.agent import Agent

pytestmark = pytest.mark.xdist_group("fleet-crash")



@pytest.fixture(scope="module")
def server(shared_server: FleetServer) -> FleetServer:
    return shared_server
TRIALS = 50


def agent_loop(url: str, root: str, state: str) -> None:
    """The victim: a real agent looping check-in → download → activate → run → report until killed.

    The download is throttled like a slow network (64 KiB per 5 ms) and the start of each phase is marked
    with a file, so the parent can aim its kill inside the download, the activation or the run.
    """
    agent = Agent(url, "victim", state, root_path=root, enroll_token="enroll-secret")
    marks = Path(state) / "marks"
    marks.mkdir(exist_ok=True)
    real_fetch, real_build, real_begin = agent._fetch, agent.installer.build_version, agent.state.begin_run

    def slow_fetch(digest: str, offset: int) -> Iterator[bytes]:
        (marks / "download").touch()
        for chunk in real_fetch(digest, offset):
            time.sleep(0.005)
            yield chunk

    def marked_build(manifest: dict[str, Any], envelope: dict[str, Any]) -> Path:
        (marks / "activation").touch()
        return real_build(manifest, envelope)

    def marked_begin(task: str, version: int) -> str:
        run_id = real_begin(task, version)
        (marks / "run").touch()
        return run_id

    agent._fetch = slow_fetch  # type: ignore[method-assign]
    agent.state.begin_run = marked_begin  # type: ignore[method-assign]
    agent.installer.build_version = marked_build  # type: ignore[method-assign]
    while True:
        agent.step()


def wait_for_mark(path: Path, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.0005)


def assert_consistent(state: Path) -> tuple[int | None, dict[str, int]]:
    """Every version folder `current` can name is complete and matches its signed manifest."""
    link = state / "tasks" / "crash" / "current"
    active = None
    if link.is_symlink():
        folder = link.parent / os.readlink(link)
        envelope = json.loads((folder / "release.json").read_text())
        for f in envelope["signed"]["files"]:
            data = (folder / f["path"]).read_bytes()
            assert len(data) == f["length"] and hashlib.sha256(data).hexdigest() == f["sha256"]
        active = int(folder.name)
    db = sqlite3.connect(state / "agent.db")
    states = dict(db.execute("SELECT state, COUNT(*) FROM outbox GROUP BY state").fetchall())
    db.close()
    return active, states


def test_kill_dash_nine_at_random_points(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    rng = random.Random(20261121)
    state = tmp_path / "victim"
    ctx = multiprocessing.get_context("fork")
    phases = {"mid-download": 0, "mid-activation": 0, "mid-run": 0}
    for trial in range(TRIALS):
        version = 2 * trial + 2
        payload = rng.randbytes(1024 * 1024)
        # Targeted at the victim alone: the server is shared with other test files' devices.
        admin.publish(make_task(tmp_path, "crash", version, files={"data.bin": payload}, schedule={"every_s": 0},
                                targeting={"kind": "device", "values": ["victim"]}),
                      server.keys, {"steps": [100], "min_reports": 10**6, "error_min_reports": 10**6})
        proc = ctx.Process(target=agent_loop, args=(server.url, str(server.keys.latest_root_path()), str(state)))
        marks = state / "marks"
        for m in ("download", "activation", "run"):
            (marks / m).unlink(missing_ok=True)
        proc.start()
        # 0: anywhere in the loop, 1: inside the download, 2: inside the activation, 3: inside the run (the
        # container start alone takes tens of ms, so a loaded machine rarely lands there by chance).
        aim = trial % 4
        if aim == 1:
            wait_for_mark(marks / "download")
            time.sleep(rng.uniform(0.0, 0.06))
        elif aim == 2:
            wait_for_mark(marks / "activation")
            time.sleep(rng.uniform(0.0, 0.004))
        elif aim == 3:
            wait_for_mark(marks / "run")
            time.sleep(rng.uniform(0.0, 0.01))
        else:
            time.sleep(rng.uniform(0.0, 0.35))
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        # What the kill left behind, before any recovery ran.
        if any((state / "partial").glob("*.part")):
            phases["mid-download"] += 1
        if any((state / "tasks" / "crash").glob("*.staging")) if (state / "tasks" / "crash").exists() else False:
            phases["mid-activation"] += 1
        active, states = assert_consistent(state)
        if states.get("running"):
            phases["mid-run"] += 1
        assert active is None or active <= version
        # Restart: the agent recovers and converges; every run it began is reported exactly once.
        agent = Agent(server.url, "victim", state, root_path=server.keys.latest_root_path(),
                      enroll_token="enroll-secret")  # the same arguments the agent was started with
        agent.step()
        active, states = assert_consistent(state)
        assert active == version, (trial, agent.errors)
        assert set(states) <= {"sent"}, states
        assert not list((state / "tasks" / "crash").glob("*.staging"))
        counts = admin.device("victim")["reports"]
        assert sum(counts.values()) == states.get("sent", 0), (counts, states)
        agent.close()
    print(f"kill -9 landed: {phases} over {TRIALS} trials")
    assert phases["mid-download"] > 0 and phases["mid-run"] > 0


def test_restart_sweeps_scratch_left_by_a_killed_run(server: FleetServer, tmp_path: Path) -> None:
    state = tmp_path / "state"
    leftovers = [state / "scratch" / f"edgerun-run-{k}" for k in range(3)]
    for d in leftovers:
        d.mkdir(parents=True)
        (d / "result.json").write_text("{}")
    agent = Agent(server.url, "sweeper", state, root_path=server.keys.latest_root_path(),
                  enroll_token="enroll-secret")
    try:
        assert not any(d.exists() for d in leftovers)
        assert (state / "scratch").is_dir()
    finally:
        agent.close()
