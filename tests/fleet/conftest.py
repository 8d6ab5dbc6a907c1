"""Fixtures of the fleet tests: one real server per test module, with its own keys."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fleet_helpers import FleetServer, start_server

from edgerun.fleet.signing import KeyDir


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
