"""Several replicas over one database, as on several hosts: a resent report counts once on every engine, the
tokens are one set for all replicas, a first start of several replicas at once on an empty database, and an
assignment-key rotation that reaches every replica without a restart."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from fleet_helpers import Clock, FleetServer, start_server

from edgerun.fleet.database import create_engine, upgrade
from edgerun.fleet.local_postgres import LocalPostgres
from edgerun.fleet.manifest import verify_assignment
from edgerun.fleet.schema import deliveries, releases
from edgerun.fleet.service import ROOT_TTL_S, FleetService
from edgerun.fleet.signing import KeyDir, Root
from edgerun.fleet.targeting import DeviceProfile

pytestmark = pytest.mark.xdist_group("fleet-replicas")


def replica(engine: sa.Engine, keys: KeyDir, clock: Callable[[], float] | None = None) -> FleetService:
    return FleetService(engine, keys.key("assignment"), online_key_loader=lambda: keys.key("assignment"),
                        clock=clock or Clock())


def report(device: str, run: str, outcome: str = "success") -> dict[str, Any]:
    return {"id": run, "task": "dedup", "version": 2, "outcome": outcome, "latency_ms": 1.0, "error": ""}


def test_a_resent_report_counts_once(engine: sa.Engine, tmp_path: Path) -> None:
    # Break: on PostgreSQL, `rowcount` is -1 for INSERT … ON CONFLICT DO NOTHING, so every resend counted.
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    service = replica(engine, keys)
    service.add_roots(keys.root_chain())
    devices = [f"dev-{i}" for i in range(60)]
    with engine.begin() as conn:
        conn.execute(releases.insert().values(
            task="dedup", version=2, envelope={}, rollback_envelope={}, targeting={"kind": "uniform"},
            policy={"steps": [100], "min_reports": 10_000}, stage="gray", step=0, paused=False, exposed=True,
            step_success=0, step_failure=0, total_success=0, total_failure=0, reason="", sim_lease_until=0.0,
            created_at=0.0, updated_at=0.0))
        conn.execute(deliveries.insert(), [{"device_id": d, "task": "dedup", "version": 2, "issued_at": 0.0}
                                           for d in devices])
    batches = [(d, [report(d, "run-1"), report(d, "run-2", "failure")]) for d in devices]
    assert service.add_report_batches(batches) == [2] * len(devices)
    # Resent three times: alone, in one group, and with a duplicate inside one request.
    assert service.add_report_batches(batches) == [0] * len(devices)
    assert service.add_report_batches(batches[:5] + batches[:5]) == [0] * 10
    assert service.add_reports("dev-0", [report("dev-0", "run-3")] * 3) == 1
    with engine.connect() as conn:
        row = conn.execute(sa.select(releases.c.total_success, releases.c.total_failure)).one()
        stored = conn.execute(sa.text("SELECT count(*) FROM reports")).scalar()
    assert (row.total_success, row.total_failure) == (len(devices) + 1, len(devices))
    assert stored == 2 * len(devices) + 1


def test_root_insertion_is_serialised_between_replicas(postgres: LocalPostgres, tmp_path: Path) -> None:
    # Break: replicas starting together on an empty database each inserted root v1; one died with
    # UniqueViolation. Here the first replica is held inside its transaction, right after its insert,
    # until the second one waits on a lock; then both must succeed.
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    engine = create_engine(postgres.create_database("roots_race"))
    upgrade(engine)
    inserted, go_on = threading.Event(), threading.Event()
    holder = threading.get_ident()

    @sa.event.listens_for(engine, "after_cursor_execute")
    def hold(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if threading.get_ident() == holder and statement.startswith("INSERT INTO roots"):
            inserted.set()
            assert go_on.wait(60)

    holder = 0
    first: list[int] = []
    errors: list[BaseException] = []

    def second() -> None:
        try:
            replica(engine, keys).add_roots(keys.root_chain())
        except BaseException as exc:
            errors.append(exc)

    def start_holder() -> None:
        nonlocal holder
        holder = threading.get_ident()
        first.append(replica(engine, keys).add_roots(keys.root_chain()))

    t = threading.Thread(target=start_holder)
    t.start()
    assert inserted.wait(60)
    u = threading.Thread(target=second)
    u.start()
    watcher = create_engine(postgres.url)
    with watcher.connect() as conn:  # the second replica is blocked on a lock the first one holds
        for _ in range(600):
            if conn.execute(sa.text("SELECT count(*) FROM pg_locks WHERE NOT granted")).scalar():
                break
            threading.Event().wait(0.05)
        else:
            pytest.fail("the second replica never waited for the first")
    watcher.dispose()
    go_on.set()
    t.join(60)
    u.join(60)
    engine.dispose()
    assert first == [1]
    assert errors == []


def test_an_assignment_key_rotation_reaches_a_replica_without_a_restart(engine: sa.Engine, tmp_path: Path) -> None:
    # Break: a replica noticed the new root but not the key copied into its folder afterwards: it kept
    # signing with the old key until restarted, and devices refused its assignments.
    keys = KeyDir(tmp_path / "keys-a")
    keys.init()
    shutil.copytree(keys.path, tmp_path / "keys-b")
    keys_b = KeyDir(tmp_path / "keys-b")
    clock = Clock()
    a, b = replica(engine, keys, clock), replica(engine, keys_b, clock)
    a.add_roots(keys.root_chain())
    assert b.root().version == 1
    keys.rotate("assignment")                       # on host A: the operator rotates and pushes the root
    assert a.add_roots(keys.root_chain()) == 2
    clock.now += ROOT_TTL_S
    root = b.root()                                  # host B sees root v2 before its key file arrives
    assert root.version == 2
    assert b.online_key.keyid not in root.signed["roles"]["assignment"]["keyids"]
    shutil.copy(keys.key_path("assignment"), keys_b.key_path("assignment"))  # the key reaches host B
    clock.now += ROOT_TTL_S
    b.root()
    signed = b.assignment(DeviceProfile("rot-1"))
    verify_assignment(Root(keys.root_chain()[-1]), signed, device_id="rot-1")


def _admin_ok(server_url: str, token: str) -> bool:
    return httpx.get(server_url + "/v1/admin/releases", headers={"Authorization": f"Bearer {token}"}).status_code == 200


def _enrols(server_url: str, token: str, device_id: str) -> bool:
    body = {"enroll_token": token, "profile": {"device_id": device_id}, "device_token": "t" * 40 + device_id}
    return httpx.post(server_url + "/v1/devices/register", json=body).status_code == 200


def test_replicas_on_several_hosts_start_together_and_share_one_set_of_tokens(postgres: LocalPostgres,
                                                                            tmp_path: Path) -> None:
    # Breaks: (a) replicas starting together on an empty database raced to insert root v1 (one died with
    # UniqueViolation; the race itself is pinned down by test_root_insertion_is_serialised_between_replicas);
    # (b) with one data folder per host, each replica made its own admin token and replaced
    # the shared enrolment token, so only the last-started host's token worked.
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    url = postgres.create_database("hosts")
    results: list[FleetServer | BaseException] = []
    barrier = threading.Barrier(2)

    def start(i: int) -> None:  # each host with its own data folder and the same token files
        barrier.wait()
        try:
            results.append(start_server(tmp_path / f"host-{i}", keys, db_url=url))
        except BaseException as exc:
            results.append(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    servers = [r for r in results if isinstance(r, FleetServer)]
    try:
        assert len(servers) == 2, [r for r in results if not isinstance(r, FleetServer)]
        # A host started without the token files would make its own: it refuses, saying which files to copy.
        with pytest.raises(RuntimeError, match="already holds another admin token"):
            start_server(tmp_path / "host-x", keys, db_url=url, token_files=False)
        assert list((tmp_path / "host-x").glob("data-*/*_token")) == []  # no generated file left to mistake
        for n, s in enumerate(servers):
            assert _admin_ok(s.url, "admin-secret")
            assert not _admin_ok(s.url, "another-secret")
            assert _enrols(s.url, "enroll-secret", f"host-dev-{n}")
    finally:
        for s in servers:
            s.stop()
