"""A device this process has not seen yet costs a database lookup of its token. That lookup runs in the
thread pool, not on the event loop: while it waits on the database, every other device's request is still
answered (at 10^5 devices a cold start queued each check-in behind the others' lookups: p50 39 s)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import httpx
import pytest

from edgerun.fleet.server import ServerConfig, create_app
from edgerun.fleet.service import DeviceIdentity
from edgerun.fleet.signing import KeyDir
from edgerun.fleet.targeting import DeviceProfile

pytestmark = pytest.mark.xdist_group("fleet-operations")

GIVE_UP_S = 10.0  # only bounds a hung run: no assertion depends on how long anything took


def test_a_token_lookup_waiting_on_the_database_holds_up_no_other_check_in(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    app = create_app(ServerConfig(tmp_path / "data", keys.path, admin_token="admin-secret", enroll_token="enrol"))
    service = app.state.service
    tokens = {d: service.register_with_server_token("enrol", DeviceProfile(d))[0] for d in ("known-dev", "cold-dev")}
    # The cold device's lookup waits on `gate`, as a lookup waits on a slow database.
    gate, looking_up, looked_up = threading.Event(), threading.Event(), threading.Event()
    lookup = service.identity

    def slow_lookup(token: str) -> DeviceIdentity | None:
        if token == tokens["cold-dev"]:
            looking_up.set()
            gate.wait(GIVE_UP_S)
            looked_up.set()
        return lookup(token)

    service.identity = slow_lookup

    async def run() -> tuple[int, bool, int, int]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fleet") as client:
            def check_in(device_id: str) -> asyncio.Task[httpx.Response]:
                return asyncio.create_task(client.post(
                    f"/v1/devices/{device_id}/checkin", headers={"Authorization": f"Bearer {tokens[device_id]}"},
                    json={"device_id": device_id, "app_version": "1.0", "os": "linux"}))

            first = (await check_in("known-dev")).status_code  # the known device's token is now held
            cold = check_in("cold-dev")
            await asyncio.to_thread(looking_up.wait, GIVE_UP_S)
            known = await check_in("known-dev")
            answered_while_waiting = not looked_up.is_set()
            gate.set()
            return first, answered_while_waiting, known.status_code, (await cold).status_code

    first, answered_while_waiting, known, cold = asyncio.run(run())
    assert first == 200 and known == 200
    assert answered_while_waiting, "the known device waited for the cold device's token lookup"
    assert cold == 200  # and the cold device is answered once its lookup returns
