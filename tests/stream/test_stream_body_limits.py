"""The standalone stream end (`python -m edgerun.stream.cloud_app`) bounds bodies while it reads them and
checks the device token before reading a batch (issue #17, "Bounded servers")."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest
from http_probe import Responsiveness, memory_growth, send_huge
from stream_helpers import CloudServer

HUGE = 80 * 1024 * 1024
TOKEN = "stream-limit-token-0123456789abcdef"


@pytest.fixture(scope="module")
def guarded_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    server = CloudServer(tmp_path_factory.mktemp("cloud-limits"), device_tokens={"dev": TOKEN}).start()
    yield server
    server.stop()


def test_unknown_token_is_refused_before_the_batch_is_read(guarded_cloud: CloudServer) -> None:
    assert guarded_cloud.proc is not None
    pid = guarded_cloud.proc.pid
    answer, grew = memory_growth(pid, send_huge, guarded_cloud.port, "POST", "/v1/stream/batches", HUGE)
    assert answer.status == 401 and grew < 24
    answer, grew = memory_growth(pid, send_huge, guarded_cloud.port, "POST", "/v1/stream/batches", HUGE,
                                 {"Authorization": "Bearer guess"}, chunked=True)
    assert answer.status == 403 and grew < 24 and answer.sent < HUGE // 4


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_80mb_batch_from_a_device_is_cut_off_at_the_limit(guarded_cloud: CloudServer, chunked: bool) -> None:
    assert guarded_cloud.proc is not None
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with Responsiveness(guarded_cloud.url + "/stats") as beside:  # 403 without a token: an answer all the same
        answer, grew = memory_growth(guarded_cloud.proc.pid, send_huge, guarded_cloud.port, "POST",
                                     "/v1/stream/batches", HUGE, auth, chunked=chunked)
    assert answer.status == 413 and "over this route" in json.loads(answer.body)["detail"]
    assert grew < 40  # the limit is 16 MiB; an 80 MB body read whole would add at least 80
    assert answer.sent < HUGE // 2
    assert beside.latencies and beside.failures == 0 and beside.slowest_s < 2.5
    # An honest batch is still stored.
    r = httpx.post(guarded_cloud.url + "/batches", headers=auth, json={"device_id": "dev", "records": [
        {"record_id": f"limit-{chunked}", "task_id": "t", "created_ms": 1, "payload": {}}]})
    assert r.status_code == 200 and r.json()["stored"] == 1
