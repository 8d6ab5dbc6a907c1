"""The tunnel against a real cloud end: compression, idempotent storage, retry through an outage, rejects."""

from __future__ import annotations

import json
import random
from pathlib import Path

import httpx
import pytest
import zstandard
from stream_helpers import CloudServer

from edgerun.stream.storage import CollectiveStore
from edgerun.stream.uploader import Backoff, Uploader, UploadError, encode_batch

FAST = dict(base_s=0.01, cap_s=0.1)


def test_batches_are_zstd_and_every_record_lands_once(tmp_path: Path, cloud: CloudServer) -> None:
    store = CollectiveStore(tmp_path / "outputs.db", flush_threshold=7)
    ids = [store.put("feature", {"i": i, "text": "the same words again " * 5}) for i in range(50)]
    uploader = Uploader(store, cloud.url, "dev-zstd", batch_records=20, backoff=Backoff(**FAST))
    assert uploader.upload_all(timeout_s=20) == 50
    raw = len(json.dumps([r.to_wire() for r in store.read("feature")]).encode())
    assert uploader.bytes_sent < raw / 3  # compressed on the wire
    got = cloud.records(device_id="dev-zstd")
    assert sorted(r["record_id"] for r in got) == sorted(ids)
    assert {r["payload"]["i"] for r in got} == set(range(50))
    counters = store.counters()
    assert counters["uploaded"] == 50 and counters["upload_batches"] == 3 and counters["pending"] == 0


def test_resending_a_batch_stores_nothing_twice(tmp_path: Path, cloud: CloudServer) -> None:
    store = CollectiveStore(tmp_path / "outputs.db")
    for i in range(5):
        store.put("t", {"i": i}, record_id=f"resend-{i}")
    batch = store.pending_batch(10)
    body = encode_batch("dev-resend", batch)
    headers = {"Content-Encoding": "zstd"}
    first = httpx.post(f"{cloud.url}/batches", content=body, headers=headers).json()
    second = httpx.post(f"{cloud.url}/batches", content=body, headers=headers).json()
    assert first == {"stored": 5, "duplicates": 0}
    assert second == {"stored": 0, "duplicates": 5}
    assert len(cloud.records(device_id="dev-resend")) == 5


def test_uploader_retries_with_backoff_until_the_cloud_is_back(tmp_path: Path) -> None:
    cloud = CloudServer(tmp_path)  # not started: the first attempts meet a closed port
    store = CollectiveStore(tmp_path / "outputs.db")
    for i in range(10):
        store.put("t", {"i": i})
    uploader = Uploader(store, cloud.url, "dev-retry", batch_records=4,
                        backoff=Backoff(base_s=0.05, cap_s=0.2, rng=random.Random(1)))
    assert uploader.upload_ready() == 0
    try:
        uploader.upload_all(timeout_s=0.3)
        raise AssertionError("upload_all cannot succeed while the cloud is down")
    except UploadError:
        pass
    assert store.counters()["upload_retries"] >= 2
    cloud.start_forked()
    try:
        assert uploader.upload_all(timeout_s=20) == 10
        assert len(cloud.records(device_id="dev-retry")) == 10
    finally:
        cloud.stop()


def test_a_batch_the_cloud_refuses_is_counted_and_does_not_block_the_queue(tmp_path: Path,
                                                                           cloud: CloudServer) -> None:
    store = CollectiveStore(tmp_path / "outputs.db")
    store.put("t", {"i": 0}, record_id="x" * 65)  # longer than the cloud accepts: a permanent 400
    uploader = Uploader(store, cloud.url, "dev-reject", batch_records=1, backoff=Backoff(**FAST))
    store.put("t", {"i": 1}, record_id="fine-after-reject")
    uploader.upload_all(timeout_s=20)
    assert store.counters()["upload_rejected"] == 1
    assert [r["record_id"] for r in cloud.records(device_id="dev-reject")] == ["fine-after-reject"]


def test_cloud_rejects_garbage(cloud: CloudServer) -> None:
    assert httpx.post(f"{cloud.url}/batches", content=b"\x28\xb5\x2f\xfdjunk",
                      headers={"Content-Encoding": "zstd"}).status_code == 400
    body = zstandard.ZstdCompressor().compress(b'{"records": []}')
    assert httpx.post(f"{cloud.url}/batches", content=body, headers={"Content-Encoding": "zstd"}).status_code == 400


def test_a_refused_token_is_retried_not_dropped_and_devices_read_only_their_own(tmp_path: Path) -> None:
    cloud = CloudServer(tmp_path, {"dev-a": "secret-a", "dev-b": "secret-b"}, admin_token="root").start()
    try:
        store = CollectiveStore(tmp_path / "outputs.db")
        for i in range(3):
            store.put("t", {"i": i})
        token = ["stale-token"]
        uploader = Uploader(store, cloud.url, "dev-a", lambda: token[0], backoff=Backoff(**FAST))
        try:
            uploader.upload_all(timeout_s=0.5)
            raise AssertionError("a refused token cannot upload")
        except UploadError:
            pass
        counters = store.counters()
        assert counters["upload_rejected"] == 0 and counters["upload_retries"] >= 1 and counters["pending"] == 3
        token[0] = "secret-a"  # the agent got its token re-issued
        assert uploader.upload_all(timeout_s=20) == 3
        assert len(cloud.records(token="secret-a", device_id="dev-a")) == 3
        assert len(cloud.records(token="root")) == 3
        for token_, params in [("secret-b", {"device_id": "dev-a"}), ("secret-b", {}), (None, {})]:
            with pytest.raises(httpx.HTTPStatusError):
                cloud.records(token=token_, **params)
    finally:
        cloud.stop()
