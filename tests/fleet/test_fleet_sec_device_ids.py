"""Device ids have one documented character set and length (edgerun/fleet/device_id.py), checked by the
server at enrolment and by the agent before it asks (docs/security.md, row E7)."""

from __future__ import annotations

import secrets
from pathlib import Path

import httpx
import pytest
from fleet_helpers import FleetServer

from edgerun.fleet.agent import Agent
from edgerun.fleet.device_id import is_device_id
from edgerun.fleet.errors import FleetError

pytestmark = pytest.mark.xdist_group("fleet-agent")

BAD_IDS = ["", "../admin", "a/b", "nul\x00id", "cr\r\nlf", "rtl\u202eid", "x" * 129, ".hidden", "-flag", "a b",
           "é"]
GOOD_IDS = ["pg-0", "Walle.phone_7", "x" * 128, "0"]


def _register(server: FleetServer, device_id: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/devices/register", json={
        "enroll_token": server.enroll_token, "device_token": secrets.token_urlsafe(32),
        "profile": {"device_id": device_id}})


@pytest.mark.parametrize("device_id", BAD_IDS, ids=range(len(BAD_IDS)))
def test_enrolment_refuses_ids_outside_the_character_set(shared_server: FleetServer, device_id: str) -> None:
    r = _register(shared_server, device_id)
    assert r.status_code == 422, r.text
    assert not is_device_id(device_id)
    admin = shared_server.admin()
    minted = admin.http.post("/v1/admin/enrolment-tokens", json={"device_id": device_id})
    assert minted.status_code == 422


def test_enrolment_accepts_ids_inside_the_character_set(shared_server: FleetServer) -> None:
    for device_id in GOOD_IDS:
        name = f"{device_id}-ok"[-128:] if len(device_id) < 128 else device_id
        assert is_device_id(name)
        assert _register(shared_server, name).status_code == 200, name


def test_the_agent_refuses_a_bad_id_before_asking(shared_server: FleetServer, tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="device id 'a/b' is not 1 to 128 characters"):
        Agent(shared_server.url, "a/b", tmp_path / "agent", root_path=shared_server.keys.latest_root_path(),
              enroll_token=shared_server.enroll_token)
