"""Warm workers: a pre-started isolated worker per task version serves triggered runs (isolated like a
cold run), is replaced when it crashes or overstays (the run is reported), and runs go concurrently."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fleet_helpers import FleetServer, make_task

from edgerun.fleet.agent import Agent

pytestmark = pytest.mark.xdist_group("fleet-agent")
POLICY = {"steps": [100], "min_reports": 100}

WARM_TASK = """\
import os, time
import numpy as np

WORKER = os.urandom(8).hex()  # pids repeat across pid namespaces; this does not
LOADED_AT = time.time()  # module level: done once per warm worker (where a task loads its model)
calls = 0

def run(inputs):
    global calls
    calls += 1
    if inputs.get("die"):
        os.kill(os.getpid(), 9)
    if inputs.get("hang"):
        time.sleep(60)
    started = time.time()
    time.sleep(inputs.get("sleep", 0))
    try:
        os.listdir(inputs["state"])
        sees_state = True
    except OSError:
        sees_state = False
    return {"pid": WORKER, "uid": os.getuid(), "calls": calls, "loaded_at": LOADED_AT,
            "sees_state": sees_state, "start": started, "end": time.time(),
            "sum": float(np.arange(4).sum())}
"""


@pytest.fixture(scope="module")
def server(shared_server: FleetServer) -> FleetServer:
    return shared_server


def _wait_warm(agent: Agent, task: str, timeout_s: float = 60) -> None:
    assert agent.pool is not None
    folder = agent.installer.active()[task][1]
    deadline = time.monotonic() + timeout_s
    while not agent.pool._idle.get(folder):
        assert time.monotonic() < deadline, "no warm worker started"
        time.sleep(0.05)


def test_warm_worker_serves_runs_isolated_and_is_replaced_after_a_crash(server: FleetServer,
                                                                        tmp_path: Path) -> None:
    admin = server.admin()
    admin.publish(make_task(tmp_path, "warm-task", 2, body=WARM_TASK, limits={"timeout_s": 2}), server.keys,
                  POLICY)
    agent = server.agent("warm-phone", tmp_path / "agent", warm_workers=True, max_concurrent_runs=2)
    agent.check_in()
    _wait_warm(agent, "warm-task")
    state = str(agent.state_dir)

    first = agent.run_task("warm-task", {"state": state})
    second = agent.run_task("warm-task", {"state": state})
    assert first.ok and second.ok, (first.error, second.error)
    assert first.extra["warm"] and first.extra["isolation"] == agent.isolation
    assert first.extra["seccomp"] == agent.isolation.startswith("bwrap")
    # One warm worker served both: same worker, the module ran once, its state carried within the version.
    assert second.output["pid"] == first.output["pid"] and second.output["calls"] == 2
    assert second.output["loaded_at"] == first.output["loaded_at"] < first.output["start"]
    assert first.output["sum"] == 6.0
    # Isolated as a cold run is: not the agent's uid (as root), and the agent's state is out of sight.
    assert first.output["sees_state"] is False
    if agent.isolation != "rlimit-only" or __import__("os").geteuid() == 0:
        assert first.output["uid"] != 0

    crashed = agent.run_task("warm-task", {"state": state, "die": True})
    assert crashed.outcome == "crash" and crashed.extra.get("worker_replaced"), crashed
    after = agent.run_task("warm-task", {"state": state})
    assert after.ok, after.error
    assert after.output["pid"] != first.output["pid"] and after.output["calls"] == 1  # a fresh worker

    hung = agent.run_task("warm-task", {"state": state, "hang": True})
    assert hung.outcome == "timeout" and hung.extra.get("worker_replaced"), hung
    assert agent.run_task("warm-task", {"state": state}).ok

    assert agent.flush_reports() == 6
    assert admin.device("warm-phone")["reports"] == {"success": 4, "crash": 1, "timeout": 1}
    assert agent.pool is not None and agent.pool.replaced == 2
    admin.close()


def test_matched_runs_go_concurrently_up_to_the_bound(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    admin.publish(make_task(tmp_path, "warm-par", 2, body=WARM_TASK, limits={"timeout_s": 10}), server.keys,
                  POLICY)
    agent = server.agent("warm-par-phone", tmp_path / "agent", warm_workers=True, max_concurrent_runs=2)
    agent.check_in()
    _wait_warm(agent, "warm-par")
    results = []

    def one() -> None:
        results.append(agent.run_task("warm-par", {"state": "/nonexistent", "sleep": 1.0}))

    threads = [threading.Thread(target=one) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r.ok for r in results) and len(results) == 3, [r.error for r in results]
    spans = sorted((r.output["start"], r.output["end"]) for r in results)
    # The bound is 2: the first two ran side by side, the third only after one of them ended.
    assert spans[0][1] > spans[1][0]
    assert spans[2][0] >= min(spans[0][1], spans[1][1]) - 0.05
    assert len({r.output["pid"] for r in results}) >= 2  # a second worker was started for the overlap
    agent.close()
    agent.pool = None
    admin.close()
