"""The records routes a reader walks and prunes the store with: a key-order page stops after the record
that passes the page's byte cap (lowered here from 8 MiB to a few KB), and removing records takes their
parts with them, needs the admin token and skips keys the store does not hold."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import sqlalchemy as sa
from fastapi import FastAPI
from fastapi.testclient import TestClient

from edgerun.stream.cloud import MAX_DELETE_KEYS, build_router, store_batch, stream_parts, stream_records

ADMIN, DEVICE = "admin-token", "device-token"


def _client(tmp_path: Path, page_bytes: int = 8 * 1024 * 1024) -> tuple[TestClient, sa.Engine]:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'cloud.db'}", connect_args={"check_same_thread": False})
    app = FastAPI()
    app.include_router(build_router(engine, verify_device=lambda device, token: token == DEVICE,
                                    verify_admin=lambda token: token == ADMIN, page_bytes=page_bytes),
                       prefix="/v1/stream")
    return TestClient(app, headers={"Authorization": f"Bearer {ADMIN}"}), engine


def _walk(client: TestClient, task: str, limit: int = 100) -> list[list[str]]:
    pages, after = [], ("", "")
    while page := client.get("/v1/stream/records", params={"task_id": task, "after_device": after[0],
                                                           "after_record": after[1], "limit": limit}).json():
        pages.append([r["record_id"] for r in page])
        after = (page[-1]["device_id"], page[-1]["record_id"])
    return pages


def test_a_key_order_page_stops_after_the_record_that_passes_the_byte_cap(tmp_path: Path) -> None:
    client, engine = _client(tmp_path, page_bytes=2500)
    # each stored payload is {"x":"aaa..."} of 1,000 bytes; one of 6,000 bytes is over the cap alone
    sizes = {"r0": 1000, "r1": 1000, "r2": 1000, "r3": 6000, "r4": 1000, "r5": 1000}
    store_batch(engine, "dev", [{"record_id": rid, "task_id": "t", "created_ms": 0,
                                 "payload": {"x": "a" * (n - 8)}} for rid, n in sizes.items()], 1)
    with engine.connect() as conn:
        stored = dict(conn.execute(sa.select(stream_records.c.record_id, sa.func.length(stream_records.c.payload))).all())
    assert stored == sizes
    # 1,000 + 1,000 + 1,000 passes 2,500 after r2; r3 passes it alone; the rest fit
    assert _walk(client, "t") == [["r0", "r1", "r2"], ["r3"], ["r4", "r5"]]
    assert _walk(client, "t", limit=2) == [["r0", "r1"], ["r2", "r3"], ["r4", "r5"]]  # the count cap first
    # the listing in arrival order (no after_device) has no byte cap
    assert len(client.get("/v1/stream/records", params={"task_id": "t"}).json()) == 6
    engine.dispose()


def test_removing_records_takes_their_parts_and_needs_the_admin_token(tmp_path: Path) -> None:
    client, engine = _client(tmp_path)
    device = {"Authorization": f"Bearer {DEVICE}"}
    data = json.dumps({"update": "x" * 5000}).encode()
    key = {"device_id": "dev", "record_id": "big"}
    start = {**key, "task_id": "t", "created_ms": 1, "bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest(), "part_bytes": 2000}
    assert client.post("/v1/stream/large", json=start, headers=device).json()["state"] == "open"
    for index in range(3):
        part = data[index * 2000:(index + 1) * 2000]
        assert client.put(f"/v1/stream/large/parts/{index}", params=key, content=part, headers={
            **device, "X-Part-Sha256": hashlib.sha256(part).hexdigest()}).status_code == 200
    assert client.post("/v1/stream/large/complete", json=key, headers=device).json()["stored"] == 1
    store_batch(engine, "dev", [{"record_id": f"s{i}", "task_id": "t", "created_ms": i, "payload": {"i": i}}
                                for i in range(3)], 1)

    keys = {"keys": [["dev", "big"], ["dev", "s0"], ["dev", "gone"], ["other", "s1"]]}
    assert client.post("/v1/stream/records/delete", json=keys, headers=device).status_code == 403
    assert client.post("/v1/stream/records/delete", json=keys).json() == {"records": 2, "parts": 3}
    assert client.post("/v1/stream/records/delete", json=keys).json() == {"records": 0, "parts": 0}
    assert _walk(client, "t") == [["s1", "s2"]]
    with engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(stream_parts)).scalar_one() == 0
    too_many = {"keys": [["dev", f"k{i}"] for i in range(MAX_DELETE_KEYS + 1)]}
    assert client.post("/v1/stream/records/delete", json=too_many).status_code == 422
    # the record may be sent again (a device that lost the answer): it is stored anew, whole
    assert client.post("/v1/stream/large", json=start, headers=device).json() == {"state": "open", "have": []}
    engine.dispose()
