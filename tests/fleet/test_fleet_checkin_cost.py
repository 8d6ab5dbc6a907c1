"""What keeps an up-to-date check-in cheap without changing what a device may believe: a signed timestamp
is reused only while it is no older than what the device says it has accepted (from any replica), and
last-seen writes are coalesced to one row update per device per resolution, profile changes at once."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from fleet_helpers import Clock

from edgerun.fleet.database import create_engine, sqlite_url, upgrade
from edgerun.fleet.errors import RollbackAttackError
from edgerun.fleet.freshness import TIMESTAMP_LIFETIME_S, verify_timestamp
from edgerun.fleet.manifest import verify_assignment
from edgerun.fleet.schema import devices, releases
from edgerun.fleet.service import FleetService
from edgerun.fleet.signing import KeyDir, Root
from edgerun.fleet.targeting import DeviceProfile

pytestmark = pytest.mark.xdist_group("fleet-replicas")


def test_a_timestamp_is_reused_only_while_the_device_would_accept_it(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    engine = create_engine(sqlite_url(tmp_path))
    upgrade(engine)
    clock = Clock()
    a, b = (FleetService(engine, keys.key("assignment"), clock=clock) for _ in range(2))
    a.add_roots(keys.root_chain())
    root = Root(keys.root_chain()[-1])
    seen = 0  # the device's highest accepted serial, kept as the agent keeps it

    def accept(envelope: dict) -> int:  # type: ignore[type-arg]
        nonlocal seen
        seen = max(seen, int(verify_timestamp(root, envelope, device_id="ts-dev", min_serial=seen)["serial"]))
        return seen

    first = a.timestamp("ts-dev", seen)  # a device that says nothing (0) gets a fresh one
    accept(first)
    assert a.timestamp("ts-dev", seen) is first  # the same replica answers with it again: no signing
    # Another replica signs its own, newer: replica A's is now older than what the device holds, and the
    # device would refuse it, so A signs afresh on hearing the device's serial.
    accept(b.timestamp("ts-dev", seen))
    again = a.timestamp("ts-dev", seen)
    assert again is not first and accept(again) == int(again["signed"]["serial"])
    # An assignment signed anywhere raises the serial the same way.
    signed = verify_assignment(root, b.assignment(DeviceProfile("ts-dev")), device_id="ts-dev", min_serial=seen)
    seen = int(signed["serial"])
    after = a.timestamp("ts-dev", seen)
    assert after is not again and accept(after) == int(after["signed"]["serial"])
    assert a.timestamp("ts-dev", seen) is after
    assert a.timestamp("ts-dev", 0) is not after  # an agent that never says its serial: always fresh
    # Reused for half its lifetime at most: a device is never handed one about to expire.
    latest = a.timestamp("ts-dev", seen)
    clock.now += TIMESTAMP_LIFETIME_S / 2
    assert a.timestamp("ts-dev", seen) is not latest
    with pytest.raises(RollbackAttackError):  # the device's own check that the reuse rule relies on
        verify_timestamp(root, first, device_id="ts-dev", min_serial=seen)
    engine.dispose()


def stored(engine: sa.Engine, device_id: str) -> tuple[float, dict]:  # type: ignore[type-arg]
    with engine.connect() as conn:
        row = conn.execute(sa.select(devices.c.last_seen, devices.c.profile).where(devices.c.id == device_id)).one()
    return row.last_seen, row.profile


def test_last_seen_writes_are_coalesced_and_profile_changes_are_not(engine: sa.Engine, tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    service = FleetService(engine, keys.key("assignment"), cache_ttl_s=0.0, seen_resolution_s=300.0)
    other = FleetService(engine, keys.key("assignment"), cache_ttl_s=0.0, seen_resolution_s=300.0)
    service.add_roots(keys.root_chain())
    token = service.create_enrolment_token(uses=2)
    for d in ("seen-a", "seen-b"):
        service.register(token, DeviceProfile(d), f"device-token-{d}-" + "x" * 32)
    t0 = time.time() + 60  # after the registrations' last-seen
    profile = DeviceProfile("seen-a", app_version="2.0")
    service.note_seen(profile, at=t0)
    service.note_seen(DeviceProfile("seen-b"), at=t0)
    assert service.flush_seen() == 2
    assert stored(engine, "seen-a") == (t0, profile.as_dict())
    service.note_seen(profile, at=t0 + 200)  # within the resolution: nothing to write
    assert service.flush_seen() == 0 and stored(engine, "seen-a")[0] == t0
    installed = DeviceProfile("seen-a", app_version="2.0", tasks={"t": 2})
    service.note_seen(installed, at=t0 + 210)  # an install: written at once
    assert service.flush_seen() == 1 and stored(engine, "seen-a") == (t0 + 210, installed.as_dict())
    service.note_seen(installed, at=t0 + 510)  # the resolution passed
    assert service.flush_seen() == 1 and stored(engine, "seen-a")[0] == t0 + 510
    other.note_seen(installed, at=t0 + 400)  # another replica's older check-in never moves last-seen back
    assert other.flush_seen() == 1 and stored(engine, "seen-a") == (t0 + 510, installed.as_dict())
    # A running step whose liveness window is 8 s: last-seen may lag by 2 s at most, or the step would count
    # devices that keep checking in as gone.
    with engine.begin() as conn:
        conn.execute(releases.insert().values(
            task="t", version=4, envelope={}, rollback_envelope={}, targeting={"kind": "uniform"},
            policy={"steps": [100], "min_reports": 5, "active_window_s": 8.0}, stage="gray", step=0, paused=False,
            exposed=True, step_success=0, step_failure=0, total_success=0, total_failure=0, reason="",
            sim_lease_until=0.0, created_at=0.0, updated_at=0.0))
    assert service.seen_resolution_s() == 2.0
    service.note_seen(installed, at=t0 + 511)
    assert service.flush_seen() == 0
    service.note_seen(installed, at=t0 + 512.5)
    assert service.flush_seen() == 1 and stored(engine, "seen-a")[0] == t0 + 512.5
