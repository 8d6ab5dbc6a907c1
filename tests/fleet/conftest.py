"""Fixtures of the fleet tests: one real server per test module, with its own keys; the files that decide
whether releases, reports and enrolment are right run once per database engine (`db_server`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fleet_helpers import BACKENDS, FleetServer, database_url, start_server

from edgerun.fleet.database import create_engine, sqlite_url, upgrade
from edgerun.fleet.local_postgres import LocalPostgres, postgres_bin_dir
from edgerun.fleet.signing import KeyDir


@pytest.fixture(scope="session")
def postgres() -> Iterator[LocalPostgres]:
    """One PostgreSQL cluster (Debian's packages) per test session and worker; each server gets a fresh
    database in it (`database_url`), so the cluster's start is paid once."""
    if postgres_bin_dir() is None:
        pytest.skip("PostgreSQL binaries are absent (Debian package `postgresql` not installed)")
    with LocalPostgres() as pg:
        yield pg


@pytest.fixture(scope="module")
def module_tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fleet")


@pytest.fixture(scope="module")
def keys(module_tmp: Path) -> KeyDir:
    k = KeyDir(module_tmp / "keys")
    k.init()
    return k


@pytest.fixture(scope="module")
def server(module_tmp: Path, keys: KeyDir) -> Iterator[FleetServer]:
    s = start_server(module_tmp, keys)
    yield s
    s.stop()


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[sa.Engine]:
    """A migrated fleet database for in-process services, once on SQLite and once on PostgreSQL."""
    e = create_engine(database_url(request, request.param) or sqlite_url(tmp_path))
    upgrade(e)
    yield e
    e.dispose()


@pytest.fixture(scope="module", params=BACKENDS)
def db_server(request: pytest.FixtureRequest, module_tmp: Path) -> Iterator[FleetServer]:
    """A real server per module and database engine (SQLite, then PostgreSQL), each with its own keys."""
    keys = KeyDir(module_tmp / f"keys-{request.param}")
    keys.init()
    s = start_server(module_tmp, keys, db_url=database_url(request, request.param))
    yield s
    s.stop()


@pytest.fixture(scope="session")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FleetServer]:
    """One server per test worker for the modules that neither rotate keys nor tamper with the store;
    their task names and device ids are distinct, so they do not see each other's results."""
    base = tmp_path_factory.mktemp("fleet-shared")
    keys = KeyDir(base / "keys")
    keys.init()
    s = start_server(base, keys)
    yield s
    s.stop()
