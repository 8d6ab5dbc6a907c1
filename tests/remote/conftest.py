"""The `server` fixture: a fresh `edgerun serve` process per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from remote_testkit import ServerProcess, start_server


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path)
    yield srv
    srv.stop()
