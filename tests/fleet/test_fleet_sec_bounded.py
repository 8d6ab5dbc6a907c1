"""Bounded server: huge bodies are refused while they are read, before parsing and before any auth work on
their content (issue #17, "Bounded servers"). A real server (uvicorn on loopback), raw-socket attackers."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from fleet_helpers import FleetServer
from http_probe import Responsiveness, memory_growth, send_huge

HUGE = 80 * 1024 * 1024
GREW_AT_MOST_MB = 24  # far below the 80 MB a buffered body would add (the old server grew by 2.2 GB)


def port_of(server: FleetServer) -> int:
    return int(urlsplit(server.url).port or 0)


def test_unauthenticated_80mb_publish_is_refused_before_a_byte_is_read(server: FleetServer) -> None:
    # Before: FastAPI parsed the whole JSON body of /v1/admin/releases and only then checked the token.
    port, pid = port_of(server), server.proc.pid
    answer, grew = memory_growth(pid, send_huge, port, "POST", "/v1/admin/releases", HUGE)
    assert answer.status == 401 and grew < GREW_AT_MOST_MB
    answer, grew = memory_growth(pid, send_huge, port, "POST", "/v1/admin/releases", HUGE,
                                 {"Authorization": "Bearer guess"}, chunked=True)
    assert answer.status == 403 and grew < GREW_AT_MOST_MB
    assert answer.sent < HUGE // 4  # refused from the headers: the body was never waited for


def test_80mb_bodies_on_open_and_device_routes_get_413_and_the_loop_stays_responsive(
        server: FleetServer, tmp_path: Path) -> None:
    port, pid = port_of(server), server.proc.pid
    agent = server.agent("bounded-dev", tmp_path / "agent")
    auth = agent._auth()
    attacks = [
        ("POST", "/v1/devices/register", {}, False),                      # open route, declared length
        ("POST", "/v1/devices/register", {}, True),                       # open route, chunked
        ("POST", "/v1/devices/bounded-dev/reports", auth, True),          # authenticated, chunked
        ("POST", "/v1/devices/bounded-dev/checkin", auth, False),
        ("POST", "/v1/stream/batches", auth, True),                       # the stream end in this server
    ]
    with Responsiveness(server.url + "/v1/health") as beside:
        for method, path, headers, chunked in attacks:
            answer, grew = memory_growth(pid, send_huge, port, method, path, HUGE, headers, chunked=chunked)
            assert answer.status == 413, (path, answer)
            assert grew < GREW_AT_MOST_MB, (path, grew)
            assert answer.sent < HUGE // 2, (path, answer.sent)  # cut off near the limit, not read to the end
            assert "over this route" in json.loads(answer.body)["detail"]
    assert beside.latencies and beside.failures == 0
    # A generous bound: a body parsed on the loop froze it for 3.1 s per 40 MB before.
    assert beside.slowest_s < 2.5
    # The device still works, and the stream end still stores a batch of honest size.
    assert agent.check_in() is False
    r = httpx.post(server.url + "/v1/stream/batches", headers=auth,
                   json={"device_id": "bounded-dev", "records": [
                       {"record_id": "r1", "task_id": "t", "created_ms": 1, "payload": {"x": 1}}]})
    assert r.status_code == 200 and r.json()["stored"] == 1


def test_a_token_of_another_device_is_refused_before_its_body_is_read(server: FleetServer, tmp_path: Path) -> None:
    owner = server.agent("bounded-owner", tmp_path / "owner")
    other = server.agent("bounded-other", tmp_path / "other")
    answer = send_huge(port_of(server), "POST", "/v1/devices/bounded-owner/reports", HUGE, other._auth(), chunked=True)
    assert answer.status == 403 and answer.sent < HUGE // 4
    assert owner.check_in() is False
