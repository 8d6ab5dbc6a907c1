"""The release server on PostgreSQL (started here from Debian's packages), two server processes sharing
one database and one store: publish on one, check in on the other, roll back across both."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from fleet_helpers import FAILING_BODY, FleetServer, make_task, start_server

from edgerun.fleet.agent import Agent
from edgerun.fleet.database import migrations_head
from edgerun.fleet.local_postgres import LocalPostgres
from edgerun.fleet.signing import KeyDir

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("fleet-postgres")]


def test_two_servers_share_postgres_and_the_store(postgres: LocalPostgres, tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    url = postgres.create_database("two_servers")
    a = start_server(tmp_path, keys, db_url=url)
    store = a.data / "blobs"
    b: FleetServer | None = None
    try:
        b = start_server(tmp_path, keys, "--store", str(store), db_url=url)
        pkg = make_task(tmp_path, "pg", 2, files={"m.bin": b"\x01" * 10_000})
        rel = a.admin().publish(pkg, keys, {"steps": [50, 100], "min_reports": 2})
        agents = [Agent(b.url if i % 2 else a.url, f"pg-{i}", tmp_path / f"pg-{i}", root_path=keys.latest_root_path(),
                        enroll_token="enroll-secret") for i in range(6)]
        for _ in range(4):
            for ag in agents:
                ag.check_in()
                if "pg" in ag.profile().tasks:
                    ag.run_task("pg")
                ag.flush_reports()
        assert b.admin().release(rel["id"])["stage"] == "completed"
        assert all(ag.profile().tasks["pg"] == 2 for ag in agents)
        bad = b.admin().publish(make_task(tmp_path, "pg", 4, body=FAILING_BODY), keys,
                                {"steps": [100], "min_reports": 10, "error_min_reports": 2, "error_threshold": 0.5})
        for ag in agents[:2]:
            ag.check_in()
            ag.run_task("pg")
            ag.flush_reports()
        assert a.admin().release(bad["id"])["stage"] == "rolled_back"
        for ag in agents:
            ag.check_in()
        assert {ag.profile().tasks["pg"] for ag in agents} == {5}
        engine = sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == migrations_head()
            n = conn.execute(sa.text("SELECT count(*) FROM reports WHERE version = 4")).scalar()
        engine.dispose()
        assert n == 2
        for ag in agents:
            ag.close()
    finally:
        a.stop()
        if b is not None:
            b.stop()
