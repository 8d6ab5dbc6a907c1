"""The compute container and the agent around it: limits, crashes, resumable downloads, task hooks."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import FleetServer, make_task

from edgerun.fleet.agent import RunFn
from edgerun.fleet.container import run_in_container
from edgerun.fleet.package import read_package

pytestmark = pytest.mark.xdist_group("fleet-agent")



@pytest.fixture(scope="module")
def server(shared_server: FleetServer) -> FleetServer:
    return shared_server


def write_task(tmp_path: Path, body: str) -> Path:
    d = tmp_path / "task"
    d.mkdir(exist_ok=True)
    (d / "main.py").write_text(body)
    return d


@pytest.mark.parametrize(("body", "outcome", "needle"), [
    ("def run(i):\n    return {'double': i['x'] * 2}\n", "success", ""),
    ("def run(i):\n    raise ValueError('nope')\n", "failure", "ValueError: nope"),
    ("import os\ndef run(i):\n    os._exit(7)\n", "crash", "exited 7"),
    ("import ctypes\ndef run(i):\n    ctypes.string_at(0)\n", "crash", "signal"),
    ("import time\ndef run(i):\n    time.sleep(30)\n", "timeout", "exceeded"),
    ("def run(i):\n    return len(bytearray(2 * 1024**3))\n", "failure", "MemoryError"),
])
def test_container_contains_every_kind_of_fault(tmp_path: Path, body: str, outcome: str, needle: str) -> None:
    start = time.monotonic()
    r = run_in_container(write_task(tmp_path, body), "main.py", {"x": 21}, timeout_s=1.5, memory_mb=256)
    assert r.outcome == outcome, r.error
    assert needle in r.error
    assert time.monotonic() - start < 10
    if outcome == "success":
        assert r.output == {"double": 42} and r.latency_ms > 0


def test_agent_survives_hanging_and_crashing_tasks_and_reports_them(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    admin.publish(make_task(tmp_path, "hang", 2, body="import time\ndef run(i):\n    time.sleep(60)\n",
                            limits={"timeout_s": 0.5}), server.keys, {"steps": [100], "min_reports": 100})
    admin.publish(make_task(tmp_path, "boom", 2, body="import os\ndef run(i):\n    os.abort()\n"),
                  server.keys, {"steps": [100], "min_reports": 100})
    agent = server.agent("hardy", tmp_path / "agent")
    agent.check_in()
    assert agent.run_task("hang").outcome == "timeout"
    assert agent.run_task("boom").outcome == "crash"
    assert agent.flush_reports() == 2
    counts = admin.device("hardy")["reports"]
    assert counts == {"timeout": 1, "crash": 1}


def test_interrupted_download_resumes_with_a_range_request(server: FleetServer, tmp_path: Path) -> None:
    blob = bytes(range(256)) * 4096  # 1 MiB
    pkg = make_task(tmp_path, "resume", 2, files={"weights.bin": blob})
    server.admin().publish(pkg, server.keys, {"steps": [100], "min_reports": 100})
    digest = next(f.sha256 for f in read_package(pkg).files if f.path == "weights.bin")
    agent = server.agent("resumer", tmp_path / "agent")
    (agent.installer.partial / f"{digest}.part").write_bytes(blob[:300_000])  # what a killed download left
    offsets: list[int] = []
    real_fetch = agent._fetch

    def recording_fetch(d: str, offset: int) -> Iterator[bytes]:
        if d == digest:
            offsets.append(offset)
        return real_fetch(d, offset)

    agent._fetch = recording_fetch  # type: ignore[method-assign]
    assert agent.check_in() is True
    assert offsets == [300_000]
    assert (agent.installer.active()["resume"][1] / "weights.bin").read_bytes() == blob
    # A partial file that is corrupt is discarded after the hash check and fetched again next time.
    agent2 = server.agent("resumer2", tmp_path / "agent2")
    (agent2.installer.partial / f"{digest}.part").write_bytes(b"\xff" * 300_000)
    agent2.check_in()
    assert "resume" not in agent2.profile().tasks and any("manifest says" in e for e in agent2.errors)
    assert agent2.check_in() is True and agent2.profile().tasks["resume"] == 2


class RecordingHooks:
    def __init__(self) -> None:
        self.activated: dict[str, tuple[dict[str, Any], RunFn]] = {}
        self.deactivated: list[str] = []
        self.polls = 0

    def on_task_activated(self, task_id: str, config: dict[str, Any], run_fn: RunFn) -> None:
        self.activated[task_id] = (config, run_fn)

    def on_task_deactivated(self, task_id: str) -> None:
        self.deactivated.append(task_id)
        self.activated.pop(task_id, None)

    def poll(self) -> None:
        self.polls += 1


def test_hooks_see_activation_triggers_and_deactivation(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    triggers = [{"sequence": ["page_enter:item", "page_exit:item"]}]
    rel = admin.publish(make_task(tmp_path, "hooked", 2, body="def run(i):\n    return {'n': len(i['events'])}\n",
                                  triggers=triggers), server.keys, {"steps": [100], "min_reports": 100})
    hooks = RecordingHooks()
    agent = server.agent("hooked-dev", tmp_path / "agent", hooks=hooks)
    agent.step()
    config, run_fn = hooks.activated["hooked"]
    assert config["triggers"] == triggers and hooks.polls == 1
    result = run_fn({"events": [{"id": 1}, {"id": 2}]})
    assert result.ok and result.output == {"n": 2}
    agent.flush_reports()
    assert admin.device("hooked-dev")["reports"] == {"success": 1}
    # A restarted agent re-announces what is already active.
    agent.close()
    hooks2 = RecordingHooks()
    again = server.agent("hooked-dev", tmp_path / "agent", hooks=hooks2)
    again.step()
    assert "hooked" in hooks2.activated
    admin.control(rel["id"], "abort")  # first release of the task: abort removes it
    again.step()
    assert hooks2.deactivated == ["hooked"] and "hooked" not in again.profile().tasks, (hooks2.deactivated, again.errors)
