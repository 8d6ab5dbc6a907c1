"""nginx (Debian's package) in front of three replicas on one PostgreSQL: half-sent requests are cut off by the
balancer's header timeout and never block anyone, agents work through it, each device's requests go to one
replica (a hash of its token) while the admin's are spread over all three, and when a device's replica is
killed the balancer sends its requests to another."""

from __future__ import annotations

import hashlib
import signal
import socket
from pathlib import Path

import httpx
import pytest
from fleet_helpers import FleetServer, make_task, start_server

from edgerun.fleet.agent import Agent
from edgerun.fleet.load_balancer import NGINX, LocalNginx
from edgerun.fleet.local_postgres import LocalPostgres
from edgerun.fleet.signing import KeyDir

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("fleet-load-balancer")]


def checkins_answered(server: FleetServer) -> int:
    """The replica's own count of check-ins answered (its Prometheus counter, read from it directly)."""
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("edgerun_fleet_checkins_total{")))


def admin_spread(lb_url: str, replicas: list[FleetServer], requests: int) -> set[int]:
    """Which replicas answer `requests` admin calls through the balancer. Each replica counts the blob
    downloads it served itself (`/v1/admin/blob-downloads`), so a blob fetched once from the first replica,
    twice from the second and so on tells, from an admin call's answer, which replica gave it."""
    admin = {"Authorization": f"Bearer {replicas[0].admin_token}"}
    blob = b"which replica answers"
    digest = hashlib.sha256(blob).hexdigest()
    assert httpx.put(f"{lb_url}/v1/admin/blobs/{digest}", content=blob, headers=admin).status_code == 200
    for i, replica in enumerate(replicas):
        for _ in range(i + 1):
            assert httpx.get(f"{replica.url}/v1/blobs/{digest}", headers=admin).content == blob
    return {httpx.get(f"{lb_url}/v1/admin/blob-downloads", headers=admin).json()[digest] - 1
            for _ in range(requests)}


@pytest.mark.skipif(not Path(NGINX).exists(), reason="nginx is absent (Debian package nginx-light)")
def test_nginx_in_front_of_three_replicas(postgres: LocalPostgres, tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    url = postgres.create_database("balanced")
    a = start_server(tmp_path / "a", keys, db_url=url)
    b = start_server(tmp_path / "b", keys, "--store", str(a.data / "blobs"), db_url=url)
    c = start_server(tmp_path / "c", keys, "--store", str(a.data / "blobs"), db_url=url)
    replicas = [a, b, c]
    half_sent: list[socket.socket] = []
    try:
        with LocalNginx([r.url for r in replicas], header_timeout_s=1, body_timeout_s=1) as lb:
            # Break: clients that send half a request and wait blocked every new request to the server.
            for _ in range(300):
                s = socket.create_connection(("127.0.0.1", lb.port))
                s.sendall(b"POST /v1/devices/register HTTP/1.1\r\nHost: fleet\r\nContent-Len")
                half_sent.append(s)
            assert all(httpx.get(lb.url + "/v1/ready").status_code == 200 for _ in range(4))
            agent = Agent(lb.url, "lb-dev", tmp_path / "lb-dev", root_path=keys.latest_root_path(),
                          enroll_token="enroll-secret")
            a.admin().publish(make_task(tmp_path, "balanced", 2), keys, {"steps": [100], "min_reports": 1})
            agent.check_in()
            assert agent.errors == [] and agent.profile().tasks == {"balanced": 2}
            # Affinity: every check-in of a device lands on the same replica (round robin alternated them).
            before = [checkins_answered(r) for r in replicas]
            for _ in range(6):
                agent.check_in()
            grew = [checkins_answered(r) - n for r, n in zip(replicas, before, strict=True)]
            assert sorted(grew) == [0, 0, 6], grew
            pinned = replicas[grew.index(6)]
            others = [r for r in replicas if r is not pinned]
            # The admin's requests, all with one token, are not pinned: every replica answers some.
            assert admin_spread(lb.url, replicas, 6) == {0, 1, 2}
            for s in half_sent:  # the balancer ends each one at its header timeout, without passing it on
                s.settimeout(60)
                answer = s.recv(4096)
                assert answer == b"" or answer.startswith(b"HTTP/1.1 408")
            # The device's replica dies (kill -9): its requests go to the other.
            pinned.proc.send_signal(signal.SIGKILL)
            pinned.proc.wait(30)
            for _ in range(4):
                assert httpx.get(lb.url + "/v1/ready").status_code == 200
            answered = sum(checkins_answered(r) for r in others)
            agent.check_in()
            assert agent.errors == [] and sum(checkins_answered(r) for r in others) == answered + 1
            agent.close()
    finally:
        for s in half_sent:
            s.close()
        for r in reversed(replicas):
            r.stop()
