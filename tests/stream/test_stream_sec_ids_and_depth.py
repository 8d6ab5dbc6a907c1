"""Record ids belong to their device, and a deeply nested batch is refused with 400 before it is parsed
(docs/security.md, rows S1 and S2)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from stream_helpers import CloudServer

from edgerun.json_limits import TooDeepError, loads_bounded, nesting_depth
from edgerun.stream.cloud import create_tables, stream_records

TOKENS = {"honest": "stream-ids-honest-0123456789abcdef", "snoop": "stream-ids-snoop-0123456789abcdef"}


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudServer]:
    server = CloudServer(tmp_path_factory.mktemp("cloud-ids"), device_tokens=TOKENS).start()
    yield server
    server.stop()


def _send(cloud: CloudServer, device: str, record_id: str, value: int) -> httpx.Response:
    return httpx.post(cloud.url + "/batches", headers={"Authorization": f"Bearer {TOKENS[device]}"},
                      json={"device_id": device, "records": [
                          {"record_id": record_id, "task_id": "t", "created_ms": value, "payload": {"v": value}}]})


def test_another_devices_record_id_does_not_turn_a_record_into_a_duplicate(cloud: CloudServer) -> None:
    assert _send(cloud, "snoop", "rec-1", 666).json() == {"stored": 1, "duplicates": 0}  # sent first
    assert _send(cloud, "honest", "rec-1", 1).json() == {"stored": 1, "duplicates": 0}
    assert _send(cloud, "honest", "rec-1", 1).json() == {"stored": 0, "duplicates": 1}  # its own resend
    honest = httpx.get(cloud.url + "/records", params={"device_id": "honest"},
                       headers={"Authorization": f"Bearer {TOKENS['honest']}"}).json()
    assert [(r["record_id"], r["payload"]) for r in honest] == [("rec-1", {"v": 1})]


def test_a_100k_deep_batch_is_refused_with_400(cloud: CloudServer) -> None:
    deep = b'{"device_id": "honest", "records": [' + b"[" * 100_000 + b"]" * 100_000 + b"]}"
    r = httpx.post(cloud.url + "/batches", content=deep, headers={"Authorization": f"Bearer {TOKENS['honest']}"})
    assert r.status_code == 400 and "nested 100002 levels deep" in r.json()["detail"]
    assert _send(cloud, "honest", "after-deep", 2).status_code == 200  # the server is fine


def test_nesting_depth_ignores_brackets_inside_strings() -> None:
    assert nesting_depth(b'{"a": "[[[{{\\"[", "b": [[1]]}') == 3
    assert nesting_depth("[]" * 1000) == 1
    with pytest.raises(TooDeepError):
        loads_bounded("[" * 65 + "]" * 65)
    assert loads_bounded("[" * 64 + "]" * 64) == json.loads("[" * 64 + "]" * 64)


def test_tables_keyed_by_record_id_alone_are_rebuilt_with_their_rows(tmp_path: Path) -> None:
    engine = sa.create_engine(f"sqlite:///{tmp_path / 'old.db'}")
    with engine.begin() as conn:  # the table as it was made when record ids were global
        conn.execute(sa.text("CREATE TABLE stream_records (record_id VARCHAR(64) PRIMARY KEY, device_id VARCHAR(200) "
                             "NOT NULL, task_id VARCHAR(200) NOT NULL, created_ms BIGINT NOT NULL, received_ms BIGINT "
                             "NOT NULL, payload TEXT NOT NULL)"))
        conn.execute(sa.text("CREATE INDEX ix_stream_records_device_id ON stream_records (device_id)"))
        conn.execute(sa.text("INSERT INTO stream_records VALUES ('r1', 'd1', 't', 1, 2, '{}')"))
    create_tables(engine)
    assert sa.inspect(engine).get_pk_constraint("stream_records")["constrained_columns"] == ["device_id", "record_id"]
    with engine.begin() as conn:
        conn.execute(sa.insert(stream_records).values(record_id="r1", device_id="d2", task_id="t", created_ms=1,
                                                      received_ms=2, payload="{}"))
        assert conn.execute(sa.select(sa.func.count()).select_from(stream_records)).scalar_one() == 2
    create_tables(engine)  # once rebuilt, a restart leaves it alone


def test_a_zstd_frame_declaring_exabytes_is_refused_without_allocating() -> None:
    """Found by the stream batch fuzzer: a one-shot decompress allocated the size the frame header declares
    (1.7 EB here: MemoryError, a 500), whatever max_output_size said."""
    from fastapi import HTTPException

    from edgerun.stream.cloud import MAX_BATCH_BYTES, decode_batch

    found = (Path(__file__).resolve().parents[2] / "fuzz" / "regressions" / "stream_batch" / "zstd-declared-size")
    with pytest.raises(HTTPException) as info:
        decode_batch(found.read_bytes()[1:], "zstd")
    assert info.value.status_code == 400
    import zstandard

    big = zstandard.ZstdCompressor().compress(b" " * (MAX_BATCH_BYTES + 1))
    with pytest.raises(HTTPException) as info:
        decode_batch(big, "zstd")
    assert info.value.status_code == 413
