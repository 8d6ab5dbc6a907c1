"""No task can stop the agent: text it produces is stored and sent safely, the agent killed at any step of
a run comes back with exactly one report per run, and a version the agent died running twice in a row is
quarantined and reported, so a crash loop cannot happen (docs/security.md, rows D14-D16)."""

from __future__ import annotations

import multiprocessing
import os
import signal
from pathlib import Path

import pytest
from fleet_helpers import FleetServer, make_task

from edgerun.fleet.agent import RUN_STEPS, Agent
from edgerun.fleet.agent_state import QUARANTINE_AFTER, safe_text

pytestmark = pytest.mark.xdist_group("fleet-agent")

SURROGATE_BODY = "def run(inputs):\n    raise RuntimeError('\\ud800 and a NUL \\x00')\n"


def _publish(server: FleetServer, tmp_path: Path, task: str, device: str, body: str, **policy: object) -> dict:
    pkg = make_task(tmp_path, task, 2, body=body, schedule={"every_s": 0},
                    targeting={"kind": "device", "values": [device]})
    return server.admin().publish(pkg, server.keys, {"steps": [100], "min_reports": 10**6, **policy})


def test_safe_text_replaces_what_utf8_and_postgresql_cannot_carry() -> None:
    assert safe_text("ok \ud800 \x00 é") == "ok \ufffd \ufffd é"
    assert safe_text("x" * 5000) == "x" * 2000
    safe_text("\udfff\ud83d").encode("utf-8")  # never raises


@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_a_lone_surrogate_in_a_tasks_error_does_not_stop_the_agent(server_shared: FleetServer, tmp_path: Path,
                                                                   warm: bool) -> None:
    device = f"surrogate-{'warm' if warm else 'cold'}"
    task = f"surrogate-{'warm' if warm else 'cold'}"
    _publish(server_shared, tmp_path, task, device, SURROGATE_BODY)
    agent = server_shared.agent(device, tmp_path / "agent", warm_workers=warm)
    agent.step()  # check-in, install, the scheduled run, reports: nothing raises
    assert agent.errors == []
    assert server_shared.admin().device(device)["reports"] == {"failure": 1}
    agent.step()  # the one device failed: its rollout rolled the release back, and the agent removed it
    assert agent.errors == [] and task not in agent.profile().tasks
    (error,) = agent.state.db.execute("SELECT error FROM outbox ORDER BY created DESC LIMIT 1").fetchone()
    assert "RuntimeError: \ufffd and a NUL \ufffd" in error


@pytest.fixture
def server_shared(shared_server: FleetServer) -> FleetServer:
    return shared_server


def _agent_until_killed(url: str, root: str, state: str, device: str, kill_step: str, kill_task: str) -> None:
    """Runs in a forked child: one agent round, SIGKILLed at `kill_step` (of `kill_task`, when named)."""
    def on_step(step: str, task: str) -> None:
        if step == kill_step and (not kill_task or task == kill_task):
            os.kill(os.getpid(), signal.SIGKILL)

    agent = Agent(url, device, state, root_path=root, enroll_token="enroll-secret", on_step=on_step)
    agent.step()
    os._exit(0)


def _run_child(server: FleetServer, state: Path, device: str, kill_step: str, kill_task: str = "") -> int:
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_agent_until_killed, args=(server.url, str(server.keys.latest_root_path()),
                                                          str(state), device, kill_step, kill_task))
    proc.start()
    proc.join(120)
    assert proc.exitcode is not None, "the agent round did not finish"
    return proc.exitcode


@pytest.mark.parametrize("step", RUN_STEPS)
def test_the_agent_killed_at_any_step_of_a_run_reports_every_run_once(server_shared: FleetServer,
                                                                      tmp_path: Path, step: str) -> None:
    device = task = f"killed-at-{step}"
    _publish(server_shared, tmp_path, task, device, "def run(inputs):\n    return 1\n")
    state = tmp_path / "agent"
    assert _run_child(server_shared, state, device, step) == -signal.SIGKILL
    agent = server_shared.agent(device, state)  # the restart
    agent.step()
    assert agent.errors == []
    interrupted = RUN_STEPS.index(step) < RUN_STEPS.index("run-recorded")
    expected = {"crash": 1, "success": 1} if interrupted else {"success": 2}
    assert server_shared.admin().device(device)["reports"] == expected
    assert agent.state.count("running") == agent.state.count("done") == 0
    assert agent.state.quarantined(task, 2) is None  # one interruption may be a power loss


def test_a_version_the_agent_dies_running_is_quarantined_and_the_others_keep_running(
        server_shared: FleetServer, tmp_path: Path) -> None:
    """Stands in for any task whose run kills the agent (as a lone surrogate in its error once did): every
    start dies at the end of its run. The count of interrupted runs survives each restart, the version is
    quarantined after QUARANTINE_AFTER of them, and both the crashes and the quarantine reach the server
    before anything else runs, so its rollout rolls it back."""
    device = "crash-looper"
    bad = _publish(server_shared, tmp_path, "looper-bad", device, "def run(inputs):\n    return 1\n",
                   error_min_reports=2, error_threshold=0.5)
    _publish(server_shared, tmp_path, "looper-good", device, "def run(inputs):\n    return 2\n")
    state = tmp_path / "agent"
    for _ in range(QUARANTINE_AFTER):
        assert _run_child(server_shared, state, device, "run-ended", "looper-bad") == -signal.SIGKILL
    assert _run_child(server_shared, state, device, "run-ended", "looper-bad") == 0  # quarantined: not run
    agent = server_shared.agent(device, state)
    assert agent.state.quarantined("looper-bad", 2) is not None
    admin = server_shared.admin()
    reports = admin.device(device)["reports"]
    assert reports["crash"] == QUARANTINE_AFTER and reports["failure"] == 1 and reports["success"] >= 1
    assert admin.release(bad["id"])["stage"] == "rolled_back"
