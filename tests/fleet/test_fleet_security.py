"""Security properties end to end: a real server on loopback, real agents, real signatures."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from fleet_helpers import FleetServer, make_task

from edgerun.fleet.errors import ExpiredError, FleetError, RollbackAttackError, SignatureError
from edgerun.fleet.manifest import sign_assignment, sign_release
from edgerun.fleet.package import read_package
from edgerun.fleet.signing import SigningKey

pytestmark = pytest.mark.xdist_group("fleet-security")
ALL_AT_ONCE = {"steps": [100], "min_reports": 1}


@pytest.fixture(scope="module")
def server(db_server: FleetServer) -> FleetServer:
    return db_server  # every test that uses it runs on SQLite and on PostgreSQL


def future_serial(n: int) -> int:
    """Above any serial the server has issued (they are its clock in microseconds)."""
    return time.time_ns() // 1000 + 10**12 + n


def test_tampered_file_is_rejected_and_never_activated(server: FleetServer, tmp_path: Path) -> None:
    pkg = make_task(tmp_path, "tamper", 2, files={"model.bin": b"\x07" * 50_000})
    server.admin().publish(pkg, server.keys, ALL_AT_ONCE)
    digest = next(f.sha256 for f in read_package(pkg).files if f.path == "model.bin")
    blob = server.data / "blobs" / digest[:2] / digest
    blob.write_bytes(b"\x08" * 50_000)  # same length, different bytes: an attacker on the store or CDN
    agent = server.agent("tamper-dev", tmp_path / "agent")
    assert agent.check_in() is False
    assert any("tamper" in e and "manifest says" in e for e in agent.errors)
    assert "tamper" not in agent.profile().tasks
    assert not (tmp_path / "agent" / "blobs" / digest).exists()
    assert not (tmp_path / "agent" / "tasks" / "tamper" / "2").exists()
    blob.write_bytes(b"\x07" * 50_000)  # the store is repaired: the next check-in installs it
    assert agent.check_in() is True
    assert agent.profile().tasks["tamper"] == 2


def test_replayed_old_manifest_and_old_assignment_are_refused(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    admin.publish(make_task(tmp_path, "replay", 2), server.keys, ALL_AT_ONCE)
    agent = server.agent("replay-dev", tmp_path / "agent")
    old_assignment = agent.http.get("/v1/devices/replay-dev/assignment", headers=agent._auth()).json()
    assert agent.check_in() is True
    admin.publish(make_task(tmp_path, "replay", 4), server.keys, ALL_AT_ONCE)
    assert agent.check_in() is True
    assert agent.profile().tasks["replay"] == 4
    # The old assignment, replayed as is: its serial is below the one already seen.
    with pytest.raises(RollbackAttackError):
        agent.apply_assignment(old_assignment)
    # The old release manifest inside a fresh, validly signed assignment: refused by version.
    fresh = sign_assignment("replay-dev", future_serial(10_000), {"replay": old_assignment["signed"]["tasks"]["replay"]},
                            server.keys.key("assignment"))
    assert agent.apply_assignment(fresh) is False
    assert any("below v4" in e for e in agent.errors)
    assert agent.profile().tasks["replay"] == 4


def test_expired_metadata_is_refused(server: FleetServer, tmp_path: Path) -> None:
    agent = server.agent("expiry-dev", tmp_path / "agent")
    agent.check_in()
    pkg = read_package(make_task(tmp_path, "expiry", 2))
    expired_release, _ = sign_release(pkg, None, server.keys.key("release"), lifetime_s=-1)
    assignment = sign_assignment("expiry-dev", future_serial(20_000), {"expiry": expired_release}, server.keys.key("assignment"))
    assert agent.apply_assignment(assignment) is False
    assert any("expired" in e for e in agent.errors)
    with pytest.raises(ExpiredError):
        agent.apply_assignment(sign_assignment("expiry-dev", future_serial(20_001), {}, server.keys.key("assignment"), lifetime_s=-1))
    assert "expiry" not in agent.profile().tasks
    # The server refuses to publish an expired manifest too.
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer admin-secret"}) as c:
        _, rb = sign_release(pkg, None, server.keys.key("release"))
        r = c.post("/v1/admin/releases", json={"envelope": expired_release, "rollback_envelope": rb})
        assert r.status_code == 400 and "expired" in r.text


def test_wrong_key_signatures_are_refused(server: FleetServer, tmp_path: Path) -> None:
    agent = server.agent("wrongkey-dev", tmp_path / "agent")
    agent.check_in()
    pkg_path = make_task(tmp_path, "wrongkey", 2)
    pkg = read_package(pkg_path)
    rogue = SigningKey.generate()
    good_release, _ = sign_release(pkg, None, server.keys.key("release"))
    with pytest.raises(SignatureError):  # assignment signed by a key the root does not name
        agent.apply_assignment(sign_assignment("wrongkey-dev", future_serial(30_000), {"wrongkey": good_release}, rogue))
    rogue_release, rogue_rb = sign_release(pkg, None, rogue)
    agent.apply_assignment(sign_assignment("wrongkey-dev", future_serial(30_001), {"wrongkey": rogue_release},
                                           server.keys.key("assignment")))
    assert any("signature" in e for e in agent.errors)
    assert "wrongkey" not in agent.profile().tasks
    server.admin().publish(pkg_path, server.keys, ALL_AT_ONCE)  # uploads the files
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer admin-secret"}) as c:
        r = c.post("/v1/admin/releases", json={"envelope": rogue_release, "rollback_envelope": rogue_rb})
        assert r.status_code == 400 and "signature" in r.text


def test_device_cannot_read_another_devices_assignment(server: FleetServer, tmp_path: Path) -> None:
    a = server.agent("iso-a", tmp_path / "a")
    b = server.agent("iso-b", tmp_path / "b")
    a.check_in()
    b.check_in()
    r = a.http.get("/v1/devices/iso-b/assignment", headers=a._auth())
    assert r.status_code == 403
    r = a.http.post("/v1/devices/iso-b/checkin", json=b.profile().as_dict(), headers=a._auth())
    assert r.status_code == 403
    r = a.http.post("/v1/devices/iso-b/reports", headers=a._auth(), json={"reports": []})
    assert r.status_code == 403
    assert a.http.get("/v1/devices/iso-b/assignment").status_code == 401
    assert b.http.get("/v1/devices/iso-b/assignment", headers=b._auth()).status_code == 200


def test_admin_endpoints_refuse_device_tokens(server: FleetServer, tmp_path: Path) -> None:
    agent = server.agent("notadmin", tmp_path / "agent")
    agent.check_in()
    headers = agent._auth()
    for method, path in [("GET", "/v1/admin/releases"), ("GET", "/v1/admin/overview"),
                         ("POST", "/v1/admin/releases/1/abort"), ("PUT", "/v1/admin/blobs/" + "0" * 64),
                         ("GET", "/v1/admin/audit"), ("POST", "/v1/admin/roots")]:
        r = agent.http.request(method, path, headers=headers, content=b"{}")
        assert r.status_code == 403, (method, path, r.status_code)
    r = agent.http.post("/v1/devices/register", json={"enroll_token": "guess", "profile": {"device_id": "x"}})
    assert r.status_code == 403


def test_key_rotation_reaches_devices(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    agent = server.agent("rotate-dev", tmp_path / "agent")
    admin.publish(make_task(tmp_path, "rotate", 2), server.keys, ALL_AT_ONCE)
    agent.check_in()
    old_release_key = server.keys.key("release")
    server.keys.rotate("release")
    assert admin.push_roots(server.keys) == agent.root.version + 1
    admin.publish(make_task(tmp_path, "rotate", 4), server.keys, ALL_AT_ONCE)
    assert agent.check_in() is True
    assert agent.root.version == 2 and agent.profile().tasks["rotate"] == 4
    # The retired release key no longer convinces the device.
    stale, _ = sign_release(read_package(make_task(tmp_path, "rotate", 6)), None, old_release_key)
    agent.apply_assignment(sign_assignment("rotate-dev", future_serial(40_000), {"rotate": stale}, server.keys.key("assignment")))
    assert any("signature" in e for e in agent.errors) and agent.profile().tasks["rotate"] == 4
    # And the device remembers the newer root across a restart.
    agent.close()
    again = server.agent("rotate-dev", tmp_path / "agent")
    assert again.root.version == 2
    with pytest.raises(FleetError):
        server.admin().push_roots(type(server.keys)(tmp_path / "nokeys"))
    assert json.loads(server.keys.latest_root_path().read_text())["signed"]["version"] == 2
