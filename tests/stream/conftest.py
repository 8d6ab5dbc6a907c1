"""Fixtures of the stream tests: a real cloud end (uvicorn on a free loopback port) per test module.

It runs in a forked copy of the test process (cheap); test_stream_tunnel also starts one with
`python -m edgerun.stream.cloud_app`, the way it is deployed standalone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from stream_helpers import CloudServer


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    server = CloudServer(tmp_path_factory.mktemp("cloud")).start_forked()
    yield server
    server.stop()
