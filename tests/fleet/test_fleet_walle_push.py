"""Push-then-pull: the server's event stream nudges the agent, which pulls its signed assignment; a lost
or restarted connection loses no release (the agent checks in once on every reconnection)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fleet_helpers import REPO, FleetServer, make_task, start_server, token_file

from edgerun.fleet.agent import Agent
from edgerun.fleet.signing import KeyDir

POLICY = {"steps": [100], "min_reports": 100}


def _restart(server: FleetServer) -> None:
    """Stop the server process and start it again on the same port and data (a deploy, a crash)."""
    server.proc.terminate()
    try:
        server.proc.wait(10)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
    port = server.url.rsplit(":", 1)[1]
    cmd = [sys.executable, "-m", "edgerun", "fleet", "serve", "--port", port, "--data", str(server.data),
           "--keys", str(server.keys.path),
           "--admin-token-file", str(token_file(server.data.parent / "restart-admin-token", server.admin_token)),
           "--enroll-token-file", str(token_file(server.data.parent / "restart-enroll-token", server.enroll_token))]
    with open(server.log, "ab") as out:
        server.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                       env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(server.url + "/v1/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError("the server did not come back")


def _wait_version(agent: Agent, task: str, version: int, within_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < within_s:
        if agent.installer.active().get(task, (0, None))[0] >= version:
            return time.monotonic() - start
        time.sleep(0.05)
    raise AssertionError(f"{task} v{version} did not arrive within {within_s}s: {agent.errors}")


@pytest.fixture()
def own_server(tmp_path: Path) -> Iterator[FleetServer]:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    s = start_server(tmp_path, keys)
    yield s
    s.stop()


def test_reconnecting_push_channel_misses_no_release(own_server: FleetServer, tmp_path: Path) -> None:
    server = own_server
    admin = server.admin()
    admin.publish(make_task(tmp_path, "pushed", 10), server.keys, POLICY)
    agent = server.agent("pushee", tmp_path / "agent", checkin_interval_s=0.2)
    stop = threading.Event()
    # A fallback poll of an hour: within this test, only a nudge or a reconnection can bring a release.
    loop = threading.Thread(target=agent.run_forever, args=(stop,),
                            kwargs={"push": True, "fallback_checkin_s": 3600.0}, daemon=True)
    loop.start()
    try:
        _wait_version(agent, "pushed", 10, 20)
        deadline = time.monotonic() + 10
        while agent.push_listener is None or agent.push_listener.connections < 1:
            assert time.monotonic() < deadline, "the push channel never opened"
            time.sleep(0.05)
        admin.publish(make_task(tmp_path, "pushed", 20), server.keys, POLICY)
        _wait_version(agent, "pushed", 20, 10)  # pushed, not polled
        assert agent.push_listener.notifications >= 1

        # The server goes away between publishes; v30 is published while no stream is open.
        admin.close()
        _restart(server)
        admin = server.admin()
        admin.publish(make_task(tmp_path, "pushed", 30), server.keys, POLICY)
        _wait_version(agent, "pushed", 30, 30)  # found by the check-in every reconnection makes
        assert agent.push_listener.connections >= 2

        # And the new stream carries the next release as a nudge again.
        time.sleep(0.5)
        admin.publish(make_task(tmp_path, "pushed", 40), server.keys, POLICY)
        _wait_version(agent, "pushed", 40, 10)
    finally:
        stop.set()
        loop.join(10)
        admin.close()
    agent.flush_reports()  # raises unless the restarted server accepts every queued report
    assert agent.state.pending_reports() == []


def test_event_stream_is_authenticated_like_the_device_api(server: FleetServer, tmp_path: Path) -> None:
    agent = server.agent("streamer", tmp_path / "agent2")
    agent.check_in()
    r = httpx.get(server.url + "/v1/devices/streamer/events", timeout=5)
    assert r.status_code == 401
    r = httpx.get(server.url + "/v1/devices/streamer/events", headers={"Authorization": "Bearer wrong"}, timeout=5)
    assert r.status_code == 403
    other = server.agent("other-streamer", tmp_path / "agent3")
    other.check_in()
    r = httpx.get(server.url + "/v1/devices/streamer/events", headers=other._auth(), timeout=5)
    assert r.status_code == 403  # another device's token does not open this device's stream
    with httpx.stream("GET", server.url + "/v1/devices/streamer/events", headers=agent._auth(), timeout=5) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        first = next(r.iter_lines())
        assert first == "event: hello"
