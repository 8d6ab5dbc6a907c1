"""Ten tasks published to one agent, five hostile (crash, hang, fork to the limit, flood stdout, a result
over the limit) and five honest: the honest tasks keep running and reporting, every hostile failure is
reported and rolls its own release back, and the agent loop stays up throughout (issue #29)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fleet_helpers import FleetServer, make_task

pytestmark = pytest.mark.xdist_group("fleet-agent")

DEVICE = "ten-tasks"
HOSTILE = {
    "t-crash": ("import os\ndef run(inputs):\n    os._exit(3)\n", {}, "crash"),
    "t-hang": ("import time\ndef run(inputs):\n    time.sleep(3600)\n", {"timeout_s": 3}, "timeout"),
    "t-fork": ("import os, time\ndef run(inputs):\n    while True:\n        if os.fork() == 0:\n"
               "            time.sleep(60)\n            os._exit(0)\n", {"processes": 16}, "failure"),
    "t-flood": ("import sys\ndef run(inputs):\n    sys.stdout.write('x' * (32 << 20))\n"
                "    raise RuntimeError('flooded')\n", {}, "failure"),
    "t-huge": ("def run(inputs):\n    return 'x' * (17 << 20)\n", {}, "crash"),
}
HONEST = [f"t-honest-{i}" for i in range(5)]


def wait_for(condition: Callable[[], object], what: Callable[[], str], limit_s: float = 180.0) -> None:
    """Poll until `condition` holds; the limit only keeps a broken build from hanging CI."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what()}"
        time.sleep(0.2)


def test_five_hostile_tasks_roll_back_and_five_honest_ones_keep_running(shared_server: FleetServer,
                                                                       tmp_path: Path) -> None:
    admin = shared_server.admin()
    target = {"kind": "device", "values": [DEVICE]}
    releases = {}
    for name, (body, limits, _) in HOSTILE.items():
        releases[name] = admin.publish(
            make_task(tmp_path, name, 2, body=body, limits=limits, schedule={"every_s": 0}, targeting=target),
            shared_server.keys, {"steps": [100], "min_reports": 10**6, "error_min_reports": 1,
                                 "error_threshold": 0.5})["id"]
    for i, name in enumerate(HONEST):
        admin.publish(make_task(tmp_path, name, 2, body=f"def run(inputs):\n    return {i}\n",
                                schedule={"every_s": 1}, targeting=target),
                      shared_server.keys, {"steps": [100], "min_reports": 10**6, "error_min_reports": 10**6})
    agent = shared_server.agent(DEVICE, tmp_path / "agent", checkin_interval_s=0.2, max_concurrent_runs=4)
    stop = threading.Event()
    loop = threading.Thread(target=agent.run_forever, kwargs={"stop": stop}, daemon=True)
    loop.start()

    def runs() -> dict[str, tuple[int, int]]:
        return {v["task"]: (v["runs"], v["failures"]) for v in admin.overview()["versions"]
                if v["task"] in (*HOSTILE, *HONEST)}

    try:
        def state() -> str:
            stages = {n: admin.release(releases[n])["stage"] for n in HOSTILE}
            return f"stages {stages}, runs {runs()}, agent errors {agent.errors}"

        wait_for(lambda: all(admin.release(releases[n])["stage"] == "rolled_back" for n in HOSTILE),
                 lambda: "every hostile release rolled back: " + state())
        wait_for(lambda: all(runs().get(n, (0, 0))[0] >= 2 for n in HONEST),
                 lambda: "two reports of every honest task: " + state())
        # A rollback reaches the agent at its next check-in, which removes the hostile task (the shared server
        # may hold other tests' releases for every device too: those stay).
        wait_for(lambda: not set(HOSTILE) & set(agent.profile().tasks) and set(HONEST) <= set(agent.profile().tasks),
                 lambda: f"the hostile tasks removed: installed {sorted(agent.profile().tasks)}; " + state())
        assert loop.is_alive()
    finally:
        stop.set()
        loop.join(60)
    counts = runs()
    assert all(counts[n][1] == 0 for n in HONEST), (counts, admin.device(DEVICE)["reports"], agent.errors)
    assert all(counts[n][1] >= 1 for n in HOSTILE), counts
    assert not loop.is_alive()
