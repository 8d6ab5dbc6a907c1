"""Operating the server: rate limits per token and per address, readiness, Prometheus metrics, JSON logs and
a graceful drain on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import httpx
import pytest
from fleet_helpers import Clock, FleetServer, start_server

from edgerun.fleet.server import ServerConfig, create_app
from edgerun.fleet.signing import KeyDir

pytestmark = pytest.mark.xdist_group("fleet-operations")


def metric(text: str, name: str) -> float:
    """One sample's value from a Prometheus exposition (0 when absent)."""
    for line in text.splitlines():
        if line.split(" ")[0] == name:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_rate_limits_per_token_and_per_address(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    clock = Clock(100.0)
    app = create_app(ServerConfig(tmp_path / "data", keys.path, admin_token="admin-secret", enroll_token="enrol",
                                  rate_per_token="1/s:3", rate_per_address="1/s:5"), clock=clock)

    async def run() -> tuple[list[int], list[int], str, int, str]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fleet") as client:
            async def admin(token: str) -> httpx.Response:
                return await client.get("/v1/admin/releases", headers={"Authorization": f"Bearer {token}"})

            first = [(await admin("admin-secret")).status_code for _ in range(4)]
            limited = await admin("admin-secret")
            second = [(await admin(f"made-up-{i}")).status_code for i in range(2)]
            clock.now += 1.0  # one token back in each bucket
            again = (await admin("admin-secret")).status_code
            scraped = (await client.get("/metrics")).text
            return first, second, limited.headers["retry-after"], again, scraped

    first, second, retry_after, again, scraped = asyncio.run(run())
    assert first == [200, 200, 200, 429]       # the token's burst of 3, then refused
    assert retry_after == "1"
    # The address has spent 5 (refusals count): a new token is still refused, by the address.
    assert second == [429, 429]
    assert again == 200
    assert metric(scraped, 'edgerun_fleet_requests_refused_total{scope="token"}') == 2
    assert metric(scraped, 'edgerun_fleet_requests_refused_total{scope="address"}') == 2


def test_readiness_metrics_json_logs_and_a_drain_on_sigterm(keys: KeyDir, tmp_path: Path) -> None:
    server: FleetServer = start_server(tmp_path, keys, "--log-level", "info")
    try:
        assert httpx.get(server.url + "/v1/ready").json() == {"ready": True, "problems": []}
        agent = server.agent("ops-1", tmp_path / "ops-1")
        agent.check_in()
        assert agent.errors == []
        scraped = httpx.get(server.url + "/metrics").text
        assert metric(scraped, 'edgerun_fleet_checkins_total{answer="up-to-date"}') >= 1
        # The store goes away: readiness says so (the load balancer stops sending), liveness stays up.
        blobs = server.data / "blobs"
        blobs.rename(server.data / "blobs-away")
        answer = httpx.get(server.url + "/v1/ready")
        assert answer.status_code == 503 and answer.json()["problems"][0].startswith("store: blob folder")
        assert httpx.get(server.url + "/v1/health").status_code == 200
        (server.data / "blobs-away").rename(blobs)
        # A push stream is open when SIGTERM comes: it ends at once and the process exits.
        with httpx.stream("GET", f"{server.url}/v1/devices/ops-1/events",
                          headers={"Authorization": f"Bearer {agent.token}"}, timeout=60) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("event: hello")
            assert metric(httpx.get(server.url + "/metrics").text, "edgerun_fleet_open_streams") == 1
            server.proc.send_signal(signal.SIGTERM)
            rest = list(lines)                  # the stream ends instead of waiting for the drain timeout
        assert all(not line.startswith("event: changed") for line in rest)
        assert server.proc.wait(60) in (0, -signal.SIGTERM)
    finally:
        server.stop()
    records = [json.loads(line) for line in server.log.read_text().splitlines() if line.startswith("{")]
    assert {"ts", "level", "logger", "msg", "pid"} <= set(records[0])
    assert any(r["msg"] == "SIGTERM: draining" for r in records)
