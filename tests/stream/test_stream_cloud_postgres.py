"""The cloud end on PostgreSQL (a throwaway cluster from Debian's packages): a resent batch, stored by
several server threads at once, still lands once, and each record is counted as new exactly once."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from edgerun.fleet.local_postgres import LocalPostgres, postgres_bin_dir
from edgerun.stream.cloud import create_tables, store_batch, stream_records

pytestmark = [pytest.mark.postgres, pytest.mark.xdist_group("stream-postgres")]


@pytest.fixture(scope="module")
def engine() -> Iterator[sa.Engine]:
    if postgres_bin_dir() is None:
        pytest.skip("PostgreSQL binaries are absent (Debian package `postgresql` not installed)")
    with LocalPostgres() as pg:
        engine = sa.create_engine(pg.url.replace("postgresql://", "postgresql+psycopg://"), pool_size=8)
        create_tables(engine)
        yield engine
        engine.dispose()


def test_concurrent_resends_store_each_record_once(engine: sa.Engine) -> None:
    batch = [{"record_id": f"pg-{i}", "task_id": "t", "created_ms": i, "payload": {"i": i}} for i in range(200)]
    results: list[dict[str, int]] = []
    barrier = threading.Barrier(6)

    def send() -> None:
        barrier.wait()
        results.append(store_batch(engine, "dev-pg", batch, 1234))

    threads = [threading.Thread(target=send) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(r["stored"] for r in results) == 200
    assert sum(r["duplicates"] for r in results) == 5 * 200
    with engine.connect() as conn:
        rows = conn.execute(sa.select(stream_records.c.record_id, stream_records.c.payload)).all()
    assert sorted(r[0] for r in rows) == sorted(f"pg-{i}" for i in range(200))
    assert {r[1] for r in rows if r[0] == "pg-7"} == {'{"i":7}'}


def test_a_table_keyed_by_record_id_alone_is_rebuilt_per_device(engine: sa.Engine) -> None:
    """Tables made when record ids were global are rebuilt, rows kept; PostgreSQL's global index names
    (the old table's `stream_records_pkey`) do not collide with the new key."""
    with engine.begin() as conn:
        conn.execute(sa.text("DROP TABLE stream_records"))
        conn.execute(sa.text("CREATE TABLE stream_records (record_id VARCHAR(64) PRIMARY KEY, device_id VARCHAR(200) "
                             "NOT NULL, task_id VARCHAR(200) NOT NULL, created_ms BIGINT NOT NULL, received_ms BIGINT "
                             "NOT NULL, payload TEXT NOT NULL)"))
        conn.execute(sa.text("CREATE INDEX ix_stream_records_device_id ON stream_records (device_id)"))
        conn.execute(sa.text("INSERT INTO stream_records VALUES ('r1', 'd1', 't', 1, 2, '{}')"))
    create_tables(engine)
    assert sa.inspect(engine).get_pk_constraint("stream_records")["constrained_columns"] == ["device_id", "record_id"]
    assert store_batch(engine, "d2", [{"record_id": "r1", "task_id": "t", "created_ms": 1, "payload": {}}], 1) == \
        {"stored": 1, "duplicates": 0}
    assert store_batch(engine, "d1", [{"record_id": "r1", "task_id": "t", "created_ms": 1, "payload": {}}], 1) == \
        {"stored": 0, "duplicates": 1}


def test_a_record_in_parts_and_key_order_pages_on_postgresql(engine: sa.Engine) -> None:
    """The large-record routes (parts kept once, a bad part refused and counted with an upsert, the whole
    checked and stored once), the key-order pages and removal by key, on PostgreSQL's dialect."""
    import hashlib
    import json

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from edgerun.stream.cloud import build_router

    app = FastAPI()
    app.include_router(build_router(engine), prefix="/v1/stream")
    client = TestClient(app)
    data = json.dumps({"update": "x" * 5000}).encode()
    key = {"device_id": "dev-parts", "record_id": "big-1"}
    start = {**key, "task_id": "parts", "created_ms": 1, "bytes": len(data),
             "sha256": hashlib.sha256(data).hexdigest(), "part_bytes": 2000}
    assert client.post("/v1/stream/large", json=start).json() == {"state": "open", "have": []}
    for _ in range(2):  # a bad part twice: the refusal count is an upsert
        bad = client.put("/v1/stream/large/parts/0", params=key, content=b"y" * 2000,
                         headers={"X-Part-Sha256": hashlib.sha256(data[:2000]).hexdigest()})
        assert bad.status_code == 422
    for index in (0, 1, 2, 1):  # part 1 resent: kept once
        part = data[index * 2000:(index + 1) * 2000]
        put = client.put(f"/v1/stream/large/parts/{index}", params=key, content=part,
                         headers={"X-Part-Sha256": hashlib.sha256(part).hexdigest()})
        assert put.status_code == 200
    assert client.post("/v1/stream/large", json=start).json()["have"] == [0, 1, 2]
    assert client.post("/v1/stream/large/complete", json=key).json() == {"stored": 1, "duplicates": 0}
    assert client.post("/v1/stream/large/complete", json=key).json() == {"stored": 0, "duplicates": 1}
    assert client.post("/v1/stream/large", json=start).json()["state"] == "stored"
    assert client.get("/v1/stream/large/payload", params=key).content == data
    assert client.get("/v1/stream/stats").json()["refused"]["part_checksum"] == 2

    store_batch(engine, "dev-parts", [{"record_id": f"small-{i}", "task_id": "parts", "created_ms": i,
                                       "payload": {"i": i}} for i in range(5)], 1)
    walked, after = [], ("", "")
    while page := client.get("/v1/stream/records", params={"task_id": "parts", "after_device": after[0],
                                                           "after_record": after[1], "limit": 2}).json():
        walked += [r["record_id"] for r in page]
        after = (page[-1]["device_id"], page[-1]["record_id"])
    assert walked == ["big-1", *(f"small-{i}" for i in range(5))]
    # removing records by key (a reader done with them) takes the large one's parts in the same transaction
    keys = {"keys": [["dev-parts", "big-1"], ["dev-parts", "small-0"], ["dev-parts", "absent"]]}
    assert client.post("/v1/stream/records/delete", json=keys).json() == {"records": 2, "parts": 3}
    assert [r["record_id"] for r in client.get("/v1/stream/records", params={"task_id": "parts"}).json()] == [
        f"small-{i}" for i in range(1, 5)]
