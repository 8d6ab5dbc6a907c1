"""Migration 0006, the federated jobs' tables, on SQLite and PostgreSQL: a database at 0005 upgrades to a
schema equal to the tables the job code queries (Alembic's own comparison), a job runs a round on it, and
the downgrade drops the tables again. A database the migrations have not reached is refused in one line."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext

from edgerun.fleet.database import MIGRATIONS, create_engine, upgrade
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated import pack_update
from edgerun.fleet.federated import round_store as db
from edgerun.fleet.federated.rounds import FederatedJob, JobConfig
from edgerun.fleet.local_postgres import LocalPostgres
from edgerun.fleet.targeting import DeviceProfile

FED_TABLES = {"fed_jobs", "fed_rounds", "fed_updates", "fed_records", "fed_weights"}


def _to(engine: sa.Engine, revision: str, down: bool = False) -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)


def _url(backend: str, tmp_path: Path, request: pytest.FixtureRequest, name: str = "fed_migration") -> str:
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'fleet.db'}"
    pg: LocalPostgres = request.getfixturevalue("postgres")
    return pg.create_database(name)


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_migration_0006_creates_the_federated_tables_and_drops_them(backend: str, tmp_path: Path,
                                                                     request: pytest.FixtureRequest) -> None:
    engine = create_engine(_url(backend, tmp_path, request))
    try:
        _to(engine, "0005")
        assert not FED_TABLES & set(sa.inspect(engine).get_table_names())
        with pytest.raises(FleetError, match="no federated tables: start the fleet server"):
            FederatedJob(engine, "digits", tmp_path / "updates")

        upgrade(engine)  # what the server does at start
        with engine.connect() as conn:
            assert set(sa.inspect(conn).get_table_names()) >= FED_TABLES
            # the migrated schema is exactly the tables round_store.py queries: no column, type or key differs
            only_fed = {"include_name": lambda name, kind, parents: (name if kind == "table" else
                                                                      parents.get("table_name") or "fed_").startswith("fed_")}
            assert compare_metadata(MigrationContext.configure(conn, opts=only_fed), db.metadata) == []

        initial = {"w": np.zeros((2, 2), np.float32)}
        job = FederatedJob.start(engine, JobConfig("digits", rounds=1, per_round=1, quorum=1, deadline_s=60.0),
                                 initial, tmp_path / "updates")
        [device] = job.open_round([DeviceProfile("phone-1")], now=0.0)
        update = {"w": np.full((2, 2), 0.5, np.float32)}
        assert job.receive(device, 1, pack_update(update), 10, now=1.0) == "accepted"
        assert job.receive(device, 1, pack_update(update), 10, now=2.0) == "duplicate"  # the (job, round, device) key
        result = job.close_round(evaluate=lambda w: 1.0, publish=lambda v, w: None)
        assert (result.outcome, result.version, result.duplicates) == ("published", 2, 1)
        np.testing.assert_array_equal(job.global_weights()["w"], update["w"])

        _to(engine, "0005", down=True)
        assert not FED_TABLES & set(sa.inspect(engine).get_table_names())
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_migration_0007_gives_open_rounds_a_running_sum_checkpoint(backend: str, tmp_path: Path,
                                                                   request: pytest.FixtureRequest) -> None:
    engine = create_engine(_url(backend, tmp_path, request, "fed_running_sum"))
    try:
        _to(engine, "0006")
        with engine.begin() as conn:  # a job with a round open before the upgrade
            conn.execute(sa.text("INSERT INTO fed_jobs (name, config, status, round, version) VALUES "
                                 "('digits', :config, 'running', 1, 1)"),
                         {"config": '{"name": "digits", "rounds": 1, "per_round": 1, "quorum": 1}'})
            conn.execute(db.weights.insert().values(job="digits", version=1, data=db.to_npz(
                {"w": np.zeros((2, 2), np.float32)})))
            conn.execute(sa.text("INSERT INTO fed_rounds (job, round, sampled, opened_at, deadline_at, duplicates) "
                                 "VALUES ('digits', 1, '[\"phone-1\"]', 0, 60, 0)"))
        upgrade(engine)
        with engine.connect() as conn:
            assert conn.execute(sa.select(db.rounds.c.sum_checkpoint)).scalar_one() is None
        job = FederatedJob(engine, "digits", tmp_path / "updates")
        update = {"w": np.full((2, 2), 0.25, np.float32)}
        assert job.receive("phone-1", 1, pack_update(update), 10, now=1.0) == "accepted"
        with engine.connect() as conn:
            checkpoint = conn.execute(sa.select(db.rounds.c.sum_checkpoint)).scalar_one()
        assert (tmp_path / "updates" / "digits" / "1" / checkpoint).exists()
        assert job.close_round(evaluate=lambda w: 1.0).participants == 1
        np.testing.assert_array_equal(job.global_weights()["w"], update["w"])

        _to(engine, "0006", down=True)
        assert "sum_checkpoint" not in {c["name"] for c in sa.inspect(engine).get_columns("fed_rounds")}
    finally:
        engine.dispose()
