"""Release stages against a real server: gray steps, automatic rollback, simulation, beta, targeting, push."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import httpx
import pytest
from fleet_helpers import FAILING_BODY, FleetServer, make_task

from edgerun.fleet.agent import Agent

pytestmark = pytest.mark.xdist_group("fleet-stages")



@pytest.fixture(scope="module")
def server(db_server: FleetServer) -> FleetServer:
    return db_server  # every test here runs on SQLite and on PostgreSQL


def fleet_of(server: FleetServer, tmp_path: Path, prefix: str, n: int, **kw: object) -> list[Agent]:
    """Agents that have enrolled and checked in once, so the server counts them in step populations."""
    agents = [server.agent(f"{prefix}-{i}", tmp_path / f"{prefix}-{i}", **kw) for i in range(n)]  # type: ignore[arg-type]
    for a in agents:
        a.check_in()
    server.wait_seen()
    return agents


def round_trip(agents: list[Agent], task: str) -> dict[int, int]:
    """One check-in round: every agent checks in, runs the task once if it has it, and reports."""
    versions: dict[int, int] = {}
    for a in agents:
        a.check_in()
    for a in agents:
        if task in a.profile().tasks:
            a.run_task(task, {})
            v = a.profile().tasks[task]
            versions[v] = versions.get(v, 0) + 1
    for a in agents:
        a.flush_reports()
    return versions


def test_gray_release_walks_its_steps_then_a_bad_version_rolls_back(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    agents = fleet_of(server, tmp_path, "gray", 12)
    rel = admin.publish(make_task(tmp_path, "gray", 2), server.keys,
                        {"steps": [25, 100], "min_reports": 2, "success_threshold": 0.9})
    first = round_trip(agents, "gray")
    assert 1 <= first.get(2, 0) <= 6  # only the 25% step's devices got it (12 × 25% = 3 expected)
    for _ in range(6):
        if admin.release(rel["id"])["stage"] == "completed":
            break
        round_trip(agents, "gray")
    assert admin.release(rel["id"])["stage"] == "completed"
    actions = [e["action"] for e in admin.audit(rel["id"])]
    assert actions == ["publish", "advance:gray:1", "advance:completed"]
    round_trip(agents, "gray")
    assert all(a.profile().tasks["gray"] == 2 for a in agents)

    bad = admin.publish(make_task(tmp_path, "gray", 4, body=FAILING_BODY), server.keys,
                        {"steps": [50, 100], "min_reports": 3, "error_threshold": 0.3, "error_min_reports": 3})
    for _ in range(4):
        round_trip(agents, "gray")
        if admin.release(bad["id"])["stage"] == "rolled_back":
            break
    state = admin.release(bad["id"])
    assert state["stage"] == "rolled_back" and "failure rate" in state["reason"]
    assert state["total_failure"] >= 3
    # Within one check-in round of the breach, every device runs the rollback version v5 with v2's files.
    versions = round_trip(agents, "gray")
    assert versions == {5: len(agents)}
    main_py = (agents[0].installer.active()["gray"][1] / "main.py").read_text()
    assert "raise" not in main_py
    actions = [e["action"] for e in admin.audit(bad["id"])]
    assert actions.count("rollback") == 1 and actions[0] == "publish"
    # v4 and its rollback v5 are taken: v5 cannot be published, v6 can.
    with pytest.raises(Exception, match="must be above"):
        admin.publish(make_task(tmp_path, "gray", 5), server.keys, {})


def test_simulation_stage_blocks_a_crashing_task_and_passes_a_good_one(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    agents = fleet_of(server, tmp_path, "sim", 2)
    crash = admin.publish(make_task(tmp_path, "simtask", 2, body="import os\ndef run(i):\n    os._exit(3)\n",
                                    simulation={"inputs": [{"x": 1}]}),
                          server.keys, {"steps": [100], "simulation_agents": 2, "beta_devices": ["sim-0"]})
    assert crash["stage"] == "simulation"
    _wait_for(lambda: admin.release(crash["id"])["stage"] != "simulation")
    assert admin.release(crash["id"])["stage"] == "aborted"
    round_trip(agents, "simtask")
    assert all("simtask" not in a.profile().tasks for a in agents)  # never reached a device, no rollback churn
    good = admin.publish(make_task(tmp_path, "simtask", 4, simulation={"inputs": [{"x": 1}, {"x": 2}]}),
                         server.keys, {"steps": [100], "min_reports": 1, "simulation_agents": 2,
                                       "beta_devices": ["sim-0"]})
    _wait_for(lambda: admin.release(good["id"])["stage"] != "simulation")
    assert admin.release(good["id"])["stage"] == "beta"
    agents[1].check_in()
    agents[0].check_in()
    assert agents[0].profile().tasks.get("simtask") == 4 and "simtask" not in agents[1].profile().tasks
    audit = [e["action"] for e in admin.audit(good["id"])]
    assert "simulation:pass" in audit and "advance:beta" in audit


def _wait_for(cond, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError("condition not met in time")


def test_targeting_precedence(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    every = {"steps": [100], "min_reports": 1}
    admin.publish(make_task(tmp_path, "tgt", 2, targeting={"kind": "uniform", "app_version": {"min": "2.0"}}),
                  server.keys, every)
    admin.publish(make_task(tmp_path, "tgt", 4, targeting={"kind": "device_group", "values": ["pixel"]}),
                  server.keys, every)
    admin.publish(make_task(tmp_path, "tgt", 6, targeting={"kind": "user_group", "values": ["vip"]}),
                  server.keys, every)
    admin.publish(make_task(tmp_path, "tgt", 8, targeting={"kind": "device", "values": ["tgt-single"]}),
                  server.keys, every)
    cases = {
        "tgt-old-app": ({"app_version": "1.9"}, None),
        "tgt-plain": ({"app_version": "2.1"}, 2),
        "tgt-pixel": ({"app_version": "2.1", "device_groups": ("pixel",)}, 4),
        "tgt-vip-pixel": ({"app_version": "1.0", "device_groups": ("pixel",), "user_groups": ("vip",)}, 6),
        "tgt-single": ({"app_version": "1.0", "device_groups": ("pixel",), "user_groups": ("vip",)}, 8),
    }
    for device_id, (kw, want) in cases.items():
        a = server.agent(device_id, tmp_path / device_id, **kw)  # type: ignore[arg-type]
        a.check_in()
        assert a.profile().tasks.get("tgt") == want, device_id


def test_pause_resume_abort_are_idempotent_over_http(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    agents = fleet_of(server, tmp_path, "ctl", 3)
    rel = admin.publish(make_task(tmp_path, "ctl", 2), server.keys, {"steps": [100], "min_reports": 4})
    assert admin.control(rel["id"], "pause")["paused"] is True
    assert admin.control(rel["id"], "pause")["paused"] is True
    round_trip(agents, "ctl")
    round_trip(agents, "ctl")
    assert admin.release(rel["id"])["step_success"] == 6
    assert admin.release(rel["id"])["stage"] == "gray"  # paused: enough reports, but no advance
    admin.control(rel["id"], "resume")
    admin.control(rel["id"], "resume")
    admin.control(rel["id"], "abort")
    again = admin.control(rel["id"], "abort")
    assert again["stage"] == "aborted"
    actions = [e["action"] for e in admin.audit(rel["id"])]
    assert actions.count("pause") == 1 and actions.count("resume") == 1 and actions.count("abort") == 1
    round_trip(agents, "ctl")
    assert all(a.profile().tasks.get("ctl") is None for a in agents)  # first release aborted: task removed


def test_concurrent_breaching_reports_roll_back_once(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    rel = admin.publish(make_task(tmp_path, "race", 2), server.keys,
                        {"steps": [100], "min_reports": 1000, "error_threshold": 0.5, "error_min_reports": 2})
    agents = fleet_of(server, tmp_path, "race", 8)
    for a in agents:
        a.check_in()

    def send(a: Agent) -> None:
        reports = [{"id": uuid.uuid4().hex, "task": "race", "version": 2, "outcome": "failure"} for _ in range(3)]
        r = httpx.post(f"{server.url}/v1/devices/{a.device_id}/reports", json={"reports": reports},
                       headers=a._auth(), timeout=30)
        assert r.status_code == 200

    threads = [threading.Thread(target=send, args=(a,)) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert admin.release(rel["id"])["stage"] == "rolled_back"
    assert [e["action"] for e in admin.audit(rel["id"])].count("rollback") == 1


def test_push_rides_on_business_requests_and_reports_are_deduplicated(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    agent = server.agent("push-dev", tmp_path / "push")
    agent.check_in()
    r = agent.http.get("/v1/health", headers=agent.profile_headers())
    assert r.headers["X-Edgerun-Assignment"] == "up-to-date"
    rel = admin.publish(make_task(tmp_path, "push", 2), server.keys, {"steps": [100], "min_reports": 50})
    r = agent.http.get("/v1/health", headers=agent.profile_headers())  # any business request
    assert r.headers["X-Edgerun-Assignment"] == "/v1/devices/push-dev/assignment"
    assert agent.handle_push_header(r.headers["X-Edgerun-Assignment"]) is True
    assert agent.profile().tasks.get("push") == 2
    agent.run_task("push")
    batch = agent.state.pending_reports()
    assert agent.flush_reports() == 1
    resent = httpx.post(f"{server.url}/v1/devices/push-dev/reports", json={"reports": batch},
                        headers=agent._auth())
    assert resent.json() == {"accepted": 0}
    assert admin.release(rel["id"])["total_success"] == 1


def test_step_thresholds_are_capped_by_population_and_empty_steps_are_skipped(server: FleetServer,
                                                                               tmp_path: Path) -> None:
    admin = server.admin()
    agents = fleet_of(server, tmp_path, "pop", 4, user_groups=("pop-users",))
    rel = admin.publish(make_task(tmp_path, "pop", 2, targeting={"kind": "user_group", "values": ["pop-users"]}),
                        server.keys, {"steps": [1, 100], "min_reports": 50, "error_min_reports": 20})
    state = admin.release(rel["id"])
    # 1% of four devices is nobody: that step is skipped (audited); 100% covers the four.
    assert state["step"] == 1 and state["step_population"] == 4
    assert "skip:empty-step" in [e["action"] for e in admin.audit(rel["id"])]
    round_trip(agents, "pop")
    # Four reports suffice where the policy asked for 50: the step covers only four devices.
    assert admin.release(rel["id"])["stage"] == "completed"


def test_a_release_published_before_its_devices_enrol_waits_for_their_reports(server: FleetServer,
                                                                              tmp_path: Path) -> None:
    admin = server.admin()
    rel = admin.publish(make_task(tmp_path, "early", 2, targeting={"kind": "device", "values": ["early-0"]}),
                        server.keys, {"steps": [1, 100], "min_reports": 10**6})
    # Nobody is enrolled yet: the 1% step is skipped, the last one waits (it was 'completed' at once, and
    # every device enrolling later got the version without a single report).
    state = admin.release(rel["id"])
    assert (state["stage"], state["step"], state["step_population"]) == ("gray", 1, 0)
    agents = fleet_of(server, tmp_path, "early", 1)
    assert admin.release(rel["id"])["stage"] == "gray"
    assert round_trip(agents, "early") == {2: 1}
    # Its one device reported: the step's population caps the million reports the policy asks for.
    assert admin.release(rel["id"])["stage"] == "completed"
