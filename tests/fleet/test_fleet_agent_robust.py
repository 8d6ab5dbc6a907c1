"""The agent survives whatever the server (or something pretending to be it) answers, and a signed release
whose config would crash it; it logs, backs off, retries, and reports what it refused."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from fleet_helpers import FleetServer

from edgerun.fleet.agent import Agent
from edgerun.fleet.canonical import iso_after
from edgerun.fleet.freshness import sign_timestamp
from edgerun.fleet.installer import Installer
from edgerun.fleet.manifest import sign_assignment
from edgerun.fleet.signing import KeyDir, sign_envelope

pytestmark = pytest.mark.xdist_group("fleet-agent")


class Hostile(BaseHTTPRequestHandler):
    """Answers every check-in with whatever `answer` holds: (status, content type, body)."""

    answer: tuple[int, str, bytes] = (200, "application/json", b"{}")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        if self.path == "/v1/devices/register":
            status, kind, body = 200, "application/json", b'{"token": "t"}'
        else:
            status, kind, body = self.answer
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hostile(tmp_path: Path) -> Iterator[tuple[str, KeyDir]]:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", keys
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("answer", [
    (200, "text/html", b"<html><body>502 Bad Gateway (a captive portal)</body></html>"),
    (502, "text/html", b"<html>bad gateway</html>"),
    (200, "application/json", b'{"status": "update", "assignment": '),
    (200, "application/json", b"[1, 2, 3]"),
    (200, "application/json", b'{"status": "update", "root_version": "seven"}'),
    (200, "application/json", b'{"status": "update", "root_version": 1, "assignment": "not an object"}'),
    (200, "application/json", b'{"status": "update", "root_version": 1, "assignment": {"signed": 5, "signatures": 7}}'),
    (200, "application/json", b'{"status": "surprise", "root_version": 1}'),
], ids=["html", "html-502", "truncated-json", "list", "string-version", "assignment-string",
        "envelope-types", "unknown-status"])
def test_agent_survives_malformed_answers_and_backs_off(hostile: tuple[str, KeyDir], tmp_path: Path,
                                                        answer: tuple[int, str, bytes]) -> None:
    url, keys = hostile
    Hostile.answer = answer
    agent = Agent(url, "robust-dev", tmp_path / "agent", root_path=keys.latest_root_path(), enroll_token="e",
                  checkin_interval_s=1.0)
    try:
        waits = []
        for _ in range(3):
            agent.step()  # never raises
            assert agent.errors and agent.errors[0].startswith("check-in:"), agent.errors
            waits.append(agent.next_wait_s())
        assert agent.failed_rounds == 3
        assert waits[2] > waits[0] and waits[2] >= 4.0  # 1 s doubled per failed round, with jitter in [0.5, 1]
        stamp = sign_timestamp("robust-dev", 1, 1, keys.key("assignment"))
        Hostile.answer = (200, "application/json",
                          json.dumps({"status": "up-to-date", "root_version": 1, "timestamp": stamp}).encode())
        agent.step()
        assert agent.errors == [] and agent.failed_rounds == 0 and agent.next_wait_s() == 1.0
    finally:
        agent.close()


BAD_CONFIGS = [{"schedule": "every minute"}, {"limits": {"timeout_s": "nan"}}, {"limits": {"memory_mb": 1e9}}]


def _signed_release(keys: KeyDir, task: str, version: int, config: dict[str, Any]) -> dict[str, Any]:
    return sign_envelope({"_type": "release", "task": task, "version": version, "expires": iso_after(3600),
                          "config": {"name": task, "version": version, "entry": "main.py", **config},
                          "files": [], "removed": False, "rollback_of": None}, [keys.key("release")])


@pytest.mark.parametrize("bad", BAD_CONFIGS, ids=["schedule", "timeout-nan", "memory-1e9"])
def test_a_signed_release_with_a_crashing_config_is_refused_and_reported_once(
        shared_server: FleetServer, tmp_path: Path, bad: dict[str, Any]) -> None:
    """Even when a bad config gets past pack and publish (signed by hand here), the agent refuses it."""
    keys = shared_server.keys
    device = f"robust-cfg-{next(iter(bad))}"
    agent = shared_server.agent(device, tmp_path / "agent")
    task = f"robust-{next(iter(bad))}"
    envelope = sign_assignment(device, int(time.time() * 1e6) + 10**12,
                               {task: _signed_release(keys, task, 5, bad)}, keys.key("assignment"))
    agent.apply_assignment(envelope)
    assert task not in agent.profile().tasks
    assert any(str(next(iter(bad))) in e for e in agent.errors), agent.errors
    agent.apply_assignment(envelope)  # the same refusal again: still one report
    assert agent.state.count("done") == 1
    reports = agent.state.pending_reports()
    assert reports[0]["outcome"] == "failure" and reports[0]["error"].startswith("refused: task.json")


def test_an_installed_version_with_a_bad_config_does_not_crash_the_agent_on_start(
        shared_server: FleetServer, tmp_path: Path) -> None:
    """A version activated before validation existed (or by an older agent): every start must survive it."""
    keys = shared_server.keys
    state = tmp_path / "agent"
    installer = Installer(state)
    envelope = _signed_release(keys, "robust-old", 3, {"schedule": "every minute", "limits": {"timeout_s": "nan"}})
    installer.build_version(envelope["signed"], envelope)
    installer.activate("robust-old", 3)
    agent = shared_server.agent("robust-old-dev", state)
    agent.step()  # check-in, announce, scheduled runs: nothing raises
    result = agent.run_task("robust-old")
    assert result.outcome == "failure" and "not run: task.json" in result.error
    assert json.loads((state / "tasks" / "robust-old" / "3" / "release.json").read_text())["signed"]["version"] == 3
