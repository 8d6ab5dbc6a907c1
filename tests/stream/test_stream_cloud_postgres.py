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
