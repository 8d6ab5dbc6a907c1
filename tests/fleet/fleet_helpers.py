"""Helpers of the fleet tests: real servers on loopback (subprocesses on free ports), task packages."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from edgerun.fleet.local_postgres import LocalPostgres
from edgerun.fleet.local_server import FleetServer, free_port, start_server, token_file
from edgerun.fleet.package import pack_task

REPO = Path(__file__).resolve().parents[2]
__all__ = ["BACKENDS", "REPO", "Clock", "FleetServer", "database_url", "free_port", "leads_step_monitor", "make_task",
           "start_server", "token_file", "wait_until"]
BACKENDS = ("sqlite", "postgresql")
_databases = itertools.count()


def wait_until(condition: Callable[[], object], limit_s: float = 60.0) -> None:
    """Polls `condition` until it holds; a test waiting on a real server process gives up after `limit_s`."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.2)


def leads_step_monitor(url: str) -> bool:
    """Whether the replica at `url` holds the step monitor's lease (its /metrics gauge)."""
    return "edgerun_fleet_step_monitor_leader 1.0" in httpx.get(url + "/metrics", timeout=5).text


class Clock:
    """Injected monotonic time for in-process services: caches' lifetimes pass when the test says so."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def database_url(request: pytest.FixtureRequest, backend: str) -> str:
    """"" (the server's own SQLite file) or a fresh PostgreSQL database in the session's cluster (the
    `postgres` fixture of conftest.py)."""
    if backend == "sqlite":
        return ""
    pg: LocalPostgres = request.getfixturevalue("postgres")
    return pg.create_database(f"fleet_{next(_databases)}")


def make_task(base: Path, name: str, version: int, body: str = "def run(inputs):\n    return {'ok': True}\n",
              files: dict[str, bytes] | None = None, **config: Any) -> Path:
    """Write a task folder and pack it; returns the package path."""
    src = base / f"{name}-v{version}-src"
    src.mkdir(parents=True, exist_ok=True)
    (src / "task.json").write_text(json.dumps({"name": name, "version": version, "entry": "main.py", **config}))
    (src / "main.py").write_text(body)
    for rel, data in (files or {}).items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    pkg = base / f"{name}-v{version}.tar"
    pack_task(src, pkg)
    return pkg


FAILING_BODY = "def run(inputs):\n    raise RuntimeError('bad version')\n"
