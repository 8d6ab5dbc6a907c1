"""Metadata freshness and rotation, serialised publishes and the push header (issue #17, "Metadata"): a real
server on loopback with a short timestamp lifetime, real agents, and second real HTTP servers that replay
answers or record whether they were contacted."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_helpers import FleetServer, make_task, start_server

from edgerun.fleet import canonical, signing
from edgerun.fleet.agent import Agent
from edgerun.fleet.errors import ExpiredError, FleetError, RollbackAttackError, SignatureError
from edgerun.fleet.manifest import sign_assignment, sign_release
from edgerun.fleet.package import read_package
from edgerun.fleet.signing import KeyDir

TIMESTAMP_TTL_S = 3
ALL_AT_ONCE = {"steps": [100], "min_reports": 1}


@pytest.fixture(scope="module")
def server(module_tmp: Path, keys: KeyDir) -> Iterator[FleetServer]:
    s = start_server(module_tmp, keys, "--timestamp-ttl", str(TIMESTAMP_TTL_S))
    yield s
    s.stop()


class Recorder:
    """A second real HTTP server on loopback: answers every request with `answer` and records it."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, str]] = []  # (method, path, authorization)
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                self.rfile.read(length)
                recorder.requests.append((self.command, self.path, self.headers.get("authorization", "")))
                body = json.dumps(recorder.answer).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _reply

            def log_message(self, *_args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch) -> Callable[[float], None]:
    """The agent's clock, moved instead of slept on: the agent judges `expires` against signing.utc_now,
    so `later(s)` makes it read the wall clock plus s seconds (later(0) puts it back)."""
    offset = [dt.timedelta(0)]
    monkeypatch.setattr(signing, "utc_now", lambda: canonical.utc_now() + offset[0])

    def move(seconds: float) -> None:
        offset[0] = dt.timedelta(seconds=seconds)

    return move


def future_serial(n: int) -> int:
    return time.time_ns() // 1000 + 10**12 + n


def test_a_replayed_up_to_date_answer_is_refused_once_it_expires(server: FleetServer, tmp_path: Path,
                                                                 later: Callable[[float], None]) -> None:
    agent = server.agent("fresh-dev", tmp_path / "agent")
    assert agent.check_in() is False  # a fresh, signed "up to date" answer is believed
    recorded = agent.http.post("/v1/devices/fresh-dev/checkin", json=agent.profile().as_dict(),
                               headers=agent._auth()).json()
    assert recorded["status"] == "up-to-date" and recorded["timestamp"]["signed"]["device_id"] == "fresh-dev"
    agent.close()
    # A new release appears; a man in the middle keeps answering "up to date" with the recorded answer.
    server.admin().publish(make_task(tmp_path, "hidden", 2), server.keys, ALL_AT_ONCE)
    replayer = Recorder(recorded)
    try:
        later(TIMESTAMP_TTL_S + 1.1)
        fooled = Agent(replayer.url, "fresh-dev", tmp_path / "agent")
        with pytest.raises(ExpiredError):
            fooled.check_in()
        # Unsigned, or signed for another device: refused at once.
        replayer.answer = {"status": "up-to-date", "root_version": 1}
        with pytest.raises(SignatureError):
            fooled.check_in()
        fooled.close()
    finally:
        replayer.close()
    later(0)
    honest = server.agent("fresh-dev", tmp_path / "agent")
    assert honest.check_in() is True and honest.profile().tasks["hidden"] == 2


def test_an_older_timestamp_is_refused_after_a_newer_serial(server: FleetServer, tmp_path: Path) -> None:
    agent = server.agent("fresh-order", tmp_path / "agent")
    agent.check_in()

    def answer() -> dict:  # type: ignore[type-arg]
        # a check-in naming no serial held: signed afresh, so each is newer than the one before
        return agent.http.post("/v1/devices/fresh-order/checkin", json=agent.profile().as_dict(),
                               headers=agent._auth()).json()["timestamp"]

    old = answer()
    agent.accept_timestamp(answer())  # a newer timestamp raises the floor
    with pytest.raises(RollbackAttackError):
        agent.accept_timestamp(old)
    other = server.agent("fresh-other", tmp_path / "other")
    other.check_in()
    with pytest.raises(SignatureError):
        other.accept_timestamp(agent.http.post("/v1/devices/fresh-order/checkin", json=agent.profile().as_dict(),
                                               headers=agent._auth()).json()["timestamp"])


def test_an_expired_release_stops_being_run(server: FleetServer, tmp_path: Path,
                                            later: Callable[[float], None]) -> None:
    agent = server.agent("expire-run", tmp_path / "agent")
    agent.check_in()
    package = read_package(make_task(tmp_path, "shortlived", 2))
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.admin_token}"}) as c:
        for digest, data in package.blobs.items():
            assert c.put(f"/v1/admin/blobs/{digest}", content=data).status_code == 200
    release, _ = sign_release(package, None, server.keys.key("release"), lifetime_s=TIMESTAMP_TTL_S)
    assert agent.apply_assignment(sign_assignment("expire-run", future_serial(1), {"shortlived": release},
                                                  server.keys.key("assignment"))) is True
    assert agent.run_task("shortlived").outcome == "success"
    queued = agent.state.count("done")
    later(TIMESTAMP_TTL_S + 1.1)
    result = agent.run_task("shortlived")
    assert result.outcome == "expired" and "expired" in result.error
    assert any("shortlived" in e and "not run" in e for e in agent.errors)
    assert agent.state.count("done") == queued  # nothing ran, so no run is reported


def publish_at_once(server: FleetServer, package: Path, barrier: threading.Barrier, outcomes: list[str]) -> None:
    admin = server.admin()
    barrier.wait()
    try:
        admin.publish(package, server.keys, ALL_AT_ONCE)
        outcomes.append("stored")
    except FleetError as exc:
        outcomes.append(str(exc))
    finally:
        admin.close()


def test_concurrent_publishes_store_each_version_once(server: FleetServer, tmp_path: Path) -> None:
    # Before: two publishes that each read "v4 is the top" both stored, so v5 existed as one's rollback
    # version and the other's release.
    for round_ in range(3):
        task = f"race{round_}"
        packages = [make_task(tmp_path / f"{task}-{i}", task, v) for i, v in enumerate((5, 6, 5, 6))]
        outcomes: list[str] = []
        barrier = threading.Barrier(len(packages))
        threads = [threading.Thread(target=publish_at_once, args=(server, p, barrier, outcomes)) for p in packages]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert outcomes.count("stored") == 1, outcomes
        assert all("(400)" in o and "must be above" in o for o in outcomes if o != "stored"), outcomes
        assert len([r for r in server.admin().releases() if r["task"] == task]) == 1


def test_the_push_header_never_sends_the_token_to_another_origin(server: FleetServer, tmp_path: Path) -> None:
    agent = server.agent("push-dev", tmp_path / "agent")
    agent.check_in()
    elsewhere = Recorder({"signed": {}, "signatures": []})
    try:
        for value in (f"{elsewhere.url}/v1/devices/push-dev/assignment",            # absolute, other origin
                      f"//{elsewhere.url.removeprefix('http://')}/v1/devices/push-dev/assignment",  # scheme-relative
                      "/v1/devices/someone-else/assignment",                          # another device's path
                      f"{server.url}/v1/devices/push-dev/assignment?x=1"):
            assert agent.handle_push_header(value) is False
            assert any("push header ignored" in e for e in agent.errors)
        assert elsewhere.requests == []  # never contacted, so the bearer token never left
    finally:
        elsewhere.close()
    # The header the server really sends still works.
    server.admin().publish(make_task(tmp_path, "pushed", 2), server.keys, ALL_AT_ONCE)
    r = httpx.get(server.url + "/v1/health", headers=agent.profile_headers())
    assert agent.handle_push_header(r.headers["x-edgerun-assignment"]) is True
    assert agent.profile().tasks["pushed"] == 2


def test_rotation_resets_floors_a_stolen_key_pushed_up(server: FleetServer, tmp_path: Path) -> None:
    # Runs last in this module: it rotates the module's keys.
    admin = server.admin()
    agent = server.agent("rotate-floor", tmp_path / "agent")
    agent.check_in()
    stolen_assignment, stolen_release = server.keys.key("assignment"), server.keys.key("release")
    # The thief signs an assignment with serial 2^62, and a release of v2^30 marked removed (no files needed).
    removed, _ = sign_release(read_package(make_task(tmp_path, "floor", 2**30)), None, stolen_release)
    removed["signed"]["removed"], removed["signed"]["files"] = True, []
    removed = {"signed": removed["signed"], "signatures": [stolen_release.signature(removed["signed"])]}
    assert agent.apply_assignment(sign_assignment("rotate-floor", 2**62, {"floor": removed}, stolen_assignment)) is False
    admin.publish(make_task(tmp_path, "floor", 3), server.keys, ALL_AT_ONCE)
    with pytest.raises(RollbackAttackError):
        agent.check_in()  # the honest assignment is below the stolen serial: the device is locked out
    # The operator rotates both online-exposed keys; the server picks up the new assignment key.
    server.keys.rotate("assignment")
    server.keys.rotate("release")
    assert admin.push_roots(server.keys) == 3
    admin.publish(make_task(tmp_path, "floor", 5), server.keys, ALL_AT_ONCE)
    assert agent.check_in() is True  # no wipe: the new root reset both floors
    assert agent.root.version == 3 and agent.profile().tasks["floor"] == 5
    # What the stolen keys sign is refused for good, floors or not.
    with pytest.raises(SignatureError):
        agent.apply_assignment(sign_assignment("rotate-floor", 2**62, {}, stolen_assignment))
