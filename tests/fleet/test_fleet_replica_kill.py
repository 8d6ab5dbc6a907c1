"""`kill -9` of a replica in the middle of a rollout on PostgreSQL, the replica that leads the step monitor:
another replica takes the lead, the release completes through it, and every run counts exactly once (the
reports the killed replica acknowledged are kept, and resending them through the other counts nothing)."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest
from fleet_helpers import leads_step_monitor, make_task, start_server, wait_until

from edgerun.fleet.local_postgres import LocalPostgres
from edgerun.fleet.signing import KeyDir

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("fleet-replicas")]

DEVICES = 12


def test_kill_9_of_the_leading_replica_mid_rollout_loses_no_count(postgres: LocalPostgres, tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    url = postgres.create_database("killed")
    a = start_server(tmp_path / "a", keys, db_url=url)
    wait_until(lambda: leads_step_monitor(a.url))  # the first replica leads the step monitor
    b = start_server(tmp_path / "b", keys, "--store", str(a.data / "blobs"), db_url=url)
    try:
        assert not leads_step_monitor(b.url)
        tokens = {f"k9-{i}": f"{'t' * 40}{i}" for i in range(DEVICES)}
        for device_id, token in tokens.items():
            assert httpx.post(a.url + "/v1/devices/register", json={
                "enroll_token": a.enroll_token, "profile": {"device_id": device_id}, "device_token": token},
                timeout=30).status_code == 200
        release = a.admin().publish(make_task(tmp_path, "k9", 2), keys, {"steps": [100], "min_reports": DEVICES})

        def device(server_url: str, device_id: str, path: str, body: object) -> httpx.Response:
            return httpx.post(f"{server_url}/v1/devices/{device_id}/{path}", json=body, timeout=30,
                              headers={"Authorization": f"Bearer {tokens[device_id]}"})

        def report(server_url: str, device_id: str) -> int:
            answer = device(server_url, device_id, "reports", {"reports": [
                {"id": f"run-{device_id}", "task": "k9", "version": 2, "outcome": "success"}]})
            assert answer.status_code == 200, answer.text
            return int(answer.json()["accepted"])

        for device_id in tokens:  # each is assigned version 2 (a delivery recorded for it)
            assert device(a.url, device_id, "checkin", {"device_id": device_id}).json()["status"] == "update"
        first, rest = list(tokens)[:DEVICES // 2], list(tokens)[DEVICES // 2:]
        assert [report(a.url, d) for d in first] == [1] * len(first)

        a.proc.send_signal(signal.SIGKILL)  # mid-rollout: half the runs reported, through the leader
        a.proc.wait(30)
        wait_until(lambda: leads_step_monitor(b.url))    # its advisory lock went with its connection: b takes the lead
        assert [report(b.url, d) for d in first] == [0] * len(first)  # resent after a lost answer: not again
        assert [report(b.url, d) for d in rest] == [1] * len(rest)
        admin_b = b.admin()
        wait_until(lambda: admin_b.release(release["id"])["stage"] == "completed")
        state = admin_b.release(release["id"])
        assert (state["total_success"], state["total_failure"]) == (DEVICES, 0)
    finally:
        b.stop()
        a.stop()
