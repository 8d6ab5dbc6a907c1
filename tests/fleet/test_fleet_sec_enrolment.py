"""Enrolment and reports you can trust (issue #17): each test replays an attack on a real server on loopback
and sees it refused."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fleet_helpers import FAILING_BODY, REPO, FleetServer, make_task, start_server

from edgerun.fleet.agent import Agent
from edgerun.fleet.database import create_engine, sqlite_url, upgrade
from edgerun.fleet.group_commit import ReportGroupCommit
from edgerun.fleet.schema import reports
from edgerun.fleet.service import FleetService
from edgerun.fleet.signing import KeyDir

ONE_STEP = {"steps": [100], "min_reports": 3, "error_min_reports": 3, "error_threshold": 0.5}


@pytest.fixture(scope="module")
def server(db_server: FleetServer) -> FleetServer:
    return db_server  # every test that uses it runs on SQLite and on PostgreSQL


def register(server: FleetServer, device_id: str, enroll_token: str, device_token: str | None = None,
             **profile: Any) -> httpx.Response:
    body: dict[str, Any] = {"enroll_token": enroll_token, "profile": {"device_id": device_id, **profile}}
    if device_token is not None:
        body["device_token"] = device_token
    return httpx.post(server.url + "/v1/devices/register", json=body)


def report(device_id: str, task: str, version: int, outcome: str, **extra: Any) -> dict[str, Any]:
    return {"id": extra.pop("id", uuid.uuid4().hex), "task": task, "version": version, "outcome": outcome,
            "latency_ms": extra.pop("latency_ms", 1.0), **extra}


def post_reports(server: FleetServer, device_id: str, token: str, items: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/devices/{device_id}/reports", json={"reports": items},
                      headers={"Authorization": f"Bearer {token}"})


def release_of(server: FleetServer, task: str) -> dict[str, Any]:
    return next(r for r in server.admin().releases() if r["task"] == task)


def test_enrolment_never_takes_over_an_existing_device(server: FleetServer, tmp_path: Path) -> None:
    victim = server.agent("enrol-victim", tmp_path / "victim")
    assert victim.check_in() is False
    # Before: the shared token re-registered the id, issued a new token and locked the victim out for good.
    for device_token in (None, secrets.token_urlsafe(32)):
        r = register(server, "enrol-victim", server.enroll_token, device_token)
        assert r.status_code == 409 and "already enrolled" in r.text and "token" not in r.json()
    assert victim.check_in() is False  # the real device still works
    # A retry of the victim's own enrolment (its answer was lost) is recognised, and issues nothing new.
    r = register(server, "enrol-victim", server.enroll_token, victim.token)
    assert r.status_code == 200 and r.json()["token"] == victim.token


def test_an_agent_whose_enrolment_answer_was_lost_enrols_again(server: FleetServer, tmp_path: Path) -> None:
    # The agent keeps the token it proposes before asking; losing the answer (a crash, a dropped
    # connection) must not leave it locked out by the "never an existing id" rule.
    first = server.agent("enrol-lost", tmp_path / "agent", enroll_token=server.admin().enrolment_token("enrol-lost"))
    proposed = first.token
    first.state.db.execute("DELETE FROM meta WHERE key = 'token'")  # as if the answer never arrived
    first.close()
    again = Agent(server.url, "enrol-lost", tmp_path / "agent", enroll_token="the single-use token is spent")
    server.agents.append(again)
    assert again.token == proposed and again.check_in() is False


def test_minted_enrolment_tokens_are_single_use_scoped_and_expire(server: FleetServer) -> None:
    admin = server.admin()
    scoped = admin.enrolment_token("enrol-scoped", ("pixel",))
    assert register(server, "enrol-intruder", scoped, secrets.token_urlsafe(32)).status_code == 403
    mine = secrets.token_urlsafe(32)
    r = register(server, "enrol-scoped", scoped, mine, device_groups=["admin-laptop"])
    assert r.status_code == 200 and r.json()["device_groups"] == ["pixel"]  # the admin's groups, not the claim
    assert register(server, "enrol-scoped", scoped, mine).status_code == 200  # a retry, not a second use
    once = admin.enrolment_token()
    assert register(server, "enrol-once-a", once, secrets.token_urlsafe(32)).status_code == 200
    r = register(server, "enrol-once-b", once, secrets.token_urlsafe(32))
    assert r.status_code == 403 and "used" in r.text
    short = admin.enrolment_token(ttl_s=0.5)
    time.sleep(1.0)
    r = register(server, "enrol-late", short, secrets.token_urlsafe(32))
    assert r.status_code == 403 and "expired" in r.text
    # The admin revokes a device (a wiped phone); its id may then enrol again with a new token.
    admin.revoke_device("enrol-once-a")
    again = admin.enrolment_token("enrol-once-a")
    assert register(server, "enrol-once-a", again, secrets.token_urlsafe(32)).status_code == 200


def test_the_servers_own_token_can_be_bounded(keys: KeyDir, tmp_path: Path) -> None:
    bounded = start_server(tmp_path, keys, "--enroll-token-uses", "2")
    try:
        answers = [register(bounded, f"bounded-{i}", bounded.enroll_token, secrets.token_urlsafe(32)).status_code
                   for i in range(3)]
        assert answers == [200, 200, 403]
    finally:
        bounded.stop()


def test_a_single_use_token_used_at_once_by_many_enrols_one_device(server: FleetServer) -> None:
    token = server.admin().enrolment_token()
    answers: list[int] = []
    barrier = threading.Barrier(8)

    def attempt(i: int) -> None:
        barrier.wait()
        answers.append(register(server, f"enrol-race-{i}", token, secrets.token_urlsafe(32)).status_code)

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [200] + [403] * 7


def test_device_groups_come_from_the_admin_not_from_check_ins(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    admin.publish(make_task(tmp_path, "pixel-only", 2, targeting={"kind": "device_group", "values": ["pixel9"]}),
                  server.keys, {"steps": [100], "min_reports": 1})
    liar = server.agent("enrol-liar", tmp_path / "liar")   # enrolled with the server's token: no groups
    liar.device_groups = ("pixel9",)                         # ... and claims the hardware class anyway
    assert liar.check_in() is False and "pixel-only" not in liar.profile().tasks
    headers = liar.profile_headers()  # the push header path judges the same way
    assert httpx.get(server.url + "/v1/health", headers=headers).headers["x-edgerun-assignment"] == "up-to-date"
    assert admin.set_device_groups("enrol-liar", ("pixel9",)) == ["pixel9"]  # the admin vouches for it
    assert liar.check_in() is True and liar.profile().tasks["pixel-only"] == 2
    assert admin.device("enrol-liar")["device_groups"] == ["pixel9"]


def test_reports_count_only_from_devices_the_release_was_delivered_to(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    target = server.agent("rep-target", tmp_path / "target")
    target.check_in()
    server.wait_seen()
    # A healthy release for one device: a device it was never given floods it with forged failures.
    admin.publish(make_task(tmp_path, "healthy", 2, targeting={"kind": "device", "values": ["rep-target"]}),
                  server.keys, ONE_STEP)
    attacker = server.agent("rep-attacker", tmp_path / "attacker")
    attacker.check_in()
    r = post_reports(server, "rep-attacker", attacker.token, [report("rep-attacker", "healthy", 2, "failure")
                                                                  for _ in range(50)])
    assert r.status_code == 200  # kept for the record, so the attacker's outbox is not stuck; never counted
    healthy = release_of(server, "healthy")
    assert healthy["stage"] == "gray" and healthy["total_failure"] == 0
    # A failing release for another device: forged successes cannot keep it alive.
    admin.publish(make_task(tmp_path, "broken", 2, body=FAILING_BODY,
                            targeting={"kind": "device", "values": ["rep-victim"]}), server.keys, ONE_STEP)
    post_reports(server, "rep-attacker", attacker.token, [report("rep-attacker", "broken", 2, "success")
                                                          for _ in range(50)])
    assert release_of(server, "broken")["total_success"] == 0
    victim = server.agent("rep-victim", tmp_path / "victim")
    server.wait_seen()
    assert victim.check_in() is True
    for _ in range(3):
        assert victim.run_task("broken").outcome == "failure"
    victim.flush_reports()
    broken = release_of(server, "broken")
    assert broken["stage"] == "rolled_back" and broken["total_failure"] == 3 and broken["total_success"] == 0
    versions = {(v["task"], v["version"]): v for v in admin.overview()["versions"]}
    assert versions[("broken", 2)]["runs"] == 3  # the dashboard counts delivered runs only


def test_a_run_counts_once_per_device(server: FleetServer, tmp_path: Path) -> None:
    admin = server.admin()
    admin.publish(make_task(tmp_path, "once", 2), server.keys, {"steps": [100], "min_reports": 100})
    a, b = server.agent("once-a", tmp_path / "a"), server.agent("once-b", tmp_path / "b")
    server.wait_seen()
    assert a.check_in() is True and b.check_in() is True
    run = report("once-a", "once", 2, "success", id="run-0001")
    for _ in range(5):  # a resend, or a replay by the device itself
        assert post_reports(server, "once-a", a.token, [run]).status_code == 200
    # Another device with the same run id is another run (ids are per device), counted once too.
    assert post_reports(server, "once-b", b.token, [run, run]).json()["accepted"] == 1
    assert release_of(server, "once")["total_success"] == 2


def test_a_nan_report_fails_only_its_own_request(server: FleetServer, tmp_path: Path) -> None:
    # Before: one device's NaN latency failed the shared transaction, and 21 of 40 honest requests got 500.
    server.admin().publish(make_task(tmp_path, "nan", 2), server.keys, {"steps": [100], "min_reports": 1000})
    honest, hostile = server.agent("nan-honest", tmp_path / "h"), server.agent("nan-hostile", tmp_path / "x")
    server.wait_seen()
    assert honest.check_in() is True and hostile.check_in() is True
    bad_bodies = [b'{"reports": [{"id": "bad-%d", "task": "nan", "version": 2, "outcome": "failure", '
                  b'"latency_ms": %s}]}' % (i, v) for i, v in enumerate([b"NaN", b"Infinity", b"-1", b"1e300"])]
    bad_bodies.append(b'{"reports": [{"id": "bad-x", "task": "nan", "version": 2, "outcome": "failure\\u0000"}]}')

    async def storm() -> tuple[list[int], list[int]]:
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            good = [client.post("/v1/devices/nan-honest/reports", headers=honest._auth(),
                                json={"reports": [report("nan-honest", "nan", 2, "success")]}) for _ in range(40)]
            bad = [client.post("/v1/devices/nan-hostile/reports", content=body,
                               headers={**hostile._auth(), "Content-Type": "application/json"})
                   for body in bad_bodies]
            answers = await asyncio.gather(*good, *bad)
        return [r.status_code for r in answers[:40]], [r.status_code for r in answers[40:]]

    good, bad = asyncio.run(storm())
    assert good == [200] * 40
    assert bad == [422] * len(bad_bodies)
    assert release_of(server, "nan")["total_success"] == 40


def test_a_report_group_that_fails_to_commit_fails_only_the_bad_request(tmp_path: Path) -> None:
    # Defence in depth behind the API's validation: a value the database refuses (SQLite stores NaN as NULL,
    # which NOT NULL refuses) fails its own request; the requests grouped with it commit alone.
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    engine = create_engine(sqlite_url(tmp_path))
    upgrade(engine)
    service = FleetService(engine, keys.key("assignment"))
    service.add_roots(keys.root_chain())
    group = ReportGroupCommit(service, gather_s=0.05)

    async def together() -> list[int | BaseException]:
        good = [group.submit(f"grp-{i}", [report(f"grp-{i}", "t", 1, "success")]) for i in range(10)]
        bad = group.submit("grp-bad", [report("grp-bad", "t", 1, "failure", latency_ms=float("nan"))])
        return await asyncio.gather(*good, bad, return_exceptions=True)

    answers = asyncio.run(together())
    assert answers[:10] == [1] * 10
    assert isinstance(answers[10], Exception)
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(reports)).scalar() == 10
    engine.dispose()


def test_the_admin_cli_mints_tokens_sets_groups_and_revokes(server: FleetServer) -> None:
    env = {**os.environ, "EDGERUN_FLEET_TOKEN": server.admin_token, "PYTHONPATH": str(REPO)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "edgerun", "fleet", "device", *args, "--server", server.url],
                              capture_output=True, text=True, env=env, cwd=REPO, timeout=60)

    minted = cli("enrol-token", "cli-dev", "--group", "rpi5")
    assert minted.returncode == 0, minted.stderr
    r = register(server, "cli-dev", minted.stdout.strip(), secrets.token_urlsafe(32))
    assert r.status_code == 200 and r.json()["device_groups"] == ["rpi5"]
    assert json.loads(cli("groups", "cli-dev", "--group", "rpi5", "--group", "lab").stdout) == ["lab", "rpi5"]
    assert cli("revoke", "cli-dev").returncode == 0
    gone = cli("revoke", "cli-dev")
    assert gone.returncode == 1 and "no device" in gone.stderr and "Traceback" not in gone.stderr
