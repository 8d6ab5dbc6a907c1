"""The step population as a SQL count over the stored device bucket, and the one elected step monitor: another
replica takes over when the leader's database connection dies, and the counts stay exact."""

from __future__ import annotations

import hashlib
import random
import time
from typing import Any

import pytest
import sqlalchemy as sa

from edgerun.fleet import releases as rel
from edgerun.fleet import rollout
from edgerun.fleet.database import create_engine, upgrade
from edgerun.fleet.local_postgres import LocalPostgres
from edgerun.fleet.schema import devices, releases
from edgerun.fleet.step_monitor import StepMonitor
from edgerun.fleet.targeting import DeviceProfile, device_bucket, in_step, matches, release_offset

pytestmark = pytest.mark.xdist_group("fleet-step-monitor")
STEPS = [0.5, 5.0, 20.0, 50.0, 100.0]


def add_devices(engine: sa.Engine, n: int, rng: random.Random) -> list[dict[str, Any]]:
    now = time.time()
    rows = []
    for i in range(n):
        device_id = f"dev-{rng.getrandbits(40):x}-{i}"
        groups = rng.sample(["pixel9", "s24", "tab"], rng.randint(0, 2))
        profile = {"device_id": device_id, "app_version": rng.choice(["1.0", "2.3", "3.1"]),
                   "os": rng.choice(["android", "ios"]), "device_groups": groups,
                   "user_groups": rng.sample(["staff", "beta"], rng.randint(0, 1)), "tasks": {}}
        rows.append({"id": device_id, "token_hash": hashlib.sha256(device_id.encode()).hexdigest(), "profile": profile, "device_groups": groups,
                     "bucket": device_bucket(device_id), "registered_at": now,
                     "last_seen": now - rng.choice([0, 10, 7200])})  # a sixth left the one-hour window
    with engine.begin() as conn:
        conn.execute(devices.insert(), rows)
    return rows


def expected(rows: list[dict[str, Any]], task: str, version: int, targeting: dict[str, Any],
             policy: rollout.RolloutPolicy, state: rollout.RolloutState) -> int:
    """The definition, device by device in Python: live, targeted, and beta or inside the step's window."""
    since = time.time() - policy.active_window_s
    pct = rollout.exposure_percent(state, policy)
    return sum(1 for r in rows if r["last_seen"] >= since
               and matches(targeting, DeviceProfile.from_dict({**r["profile"], "device_groups": r["device_groups"]}))
               and (r["id"] in policy.beta_devices
                    or (state.stage == "gray" and in_step(r["bucket"], release_offset(task, version), pct))))


def test_the_step_population_is_a_count_over_the_stored_bucket(engine: sa.Engine) -> None:
    rng = random.Random(7)
    rows = add_devices(engine, 3000, rng)
    beta = tuple(r["id"] for r in rows[:5])
    targetings = [{"kind": "uniform"}, {"kind": "device_group", "values": ["pixel9"]},
                  {"kind": "user_group", "values": ["staff"], "os": ["android"]},
                  {"kind": "uniform", "app_version": {"min": "2.0"}}]
    checked = 0
    with engine.connect() as conn:
        for version, targeting in enumerate(targetings, start=2):
            for beta_devices in ((), beta):
                policy = rollout.RolloutPolicy(steps=tuple(STEPS), active_window_s=3600, beta_devices=beta_devices)
                states = [rollout.RolloutState(stage="gray", step=i) for i in range(len(STEPS))]
                for state in [*states, rollout.RolloutState(stage="beta")] if beta_devices else states:
                    got = rel.step_population(conn, "pop", version, targeting, policy, state)
                    assert got == expected(rows, "pop", version, targeting, policy, state)
                    checked += got > 0
    assert checked > 30  # the counts compared were mostly not zero


def insert_release(engine: sa.Engine, population: int) -> int:
    now = time.time()
    with engine.begin() as conn:
        return int(conn.execute(releases.insert().values(
            task="mon", version=2, envelope={}, rollback_envelope={}, targeting={"kind": "uniform"},
            policy={"steps": STEPS, "min_reports": 10_000, "active_window_s": 3600}, stage="gray", step=2,
            paused=False, exposed=True, step_success=0, step_failure=0, total_success=0, total_failure=0, reason="",
            sim_lease_until=0.0, step_population=population, created_at=now, updated_at=now)).inserted_primary_key[0])


def stored_population(engine: sa.Engine, release_id: int) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.select(releases.c.step_population).where(releases.c.id == release_id)).scalar_one())


def test_one_replica_monitors_and_another_takes_over_when_it_dies(postgres: LocalPostgres) -> None:
    url = postgres.create_database("monitors")
    a_engine, b_engine, watcher = create_engine(url), create_engine(url), create_engine(url)
    upgrade(a_engine)
    rows = add_devices(a_engine, 1000, random.Random(3))
    release_id = insert_release(a_engine, population=0)
    policy = rollout.RolloutPolicy(steps=tuple(STEPS), active_window_s=3600)
    want = expected(rows, "mon", 2, {"kind": "uniform"}, policy, rollout.RolloutState(stage="gray", step=2))
    a, b = (StepMonitor(e, 0, on_change=lambda: None) for e in (a_engine, b_engine))
    try:
        assert a.tick() == 0 and b.tick() is None        # a leads; b stands by
        assert stored_population(a_engine, release_id) == want
        add_devices(a_engine, 300, random.Random(4))
        with watcher.connect() as conn:                   # the leader's process dies: its connection ends
            # With a timeout, pg_terminate_backend returns once the backend has exited and so released its
            # session lock; without one it only sends the signal, and b could try the lock before it is free.
            assert conn.execute(sa.text("SELECT pg_terminate_backend(:p, 60000)"),
                                {"p": a.leadership.backend_pid}).scalar()
        assert b.tick() == 0 and a.tick() is None         # b takes over; a, back, finds it taken
        with a_engine.connect() as conn:
            state = rel.state_of(conn.execute(sa.select(releases).where(releases.c.id == release_id)).one())
            assert stored_population(a_engine, release_id) == rel.step_population(
                conn, "mon", 2, {"kind": "uniform"}, policy, state) > want
    finally:
        a.stop()
        b.stop()
        for e in (a_engine, b_engine, watcher):
            e.dispose()
