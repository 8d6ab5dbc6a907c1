"""The cloud end of the tunnel: a FastAPI router the fleet server mounts at /v1/stream.

Each batch is zstd-compressed JSON; records are inserted with ON CONFLICT (device_id, record_id) DO
NOTHING, so a batch the device resends after a crash is stored once (at-least-once delivery + idempotent
storage = exactly-once storage). Record ids are the device's own: they are unique per device, so a device
that learns another's record id cannot make that device's record a "duplicate". A batch's JSON nesting is
bounded before it is parsed (`json_limits.py`). Works on the fleet server's engine: SQLite by default,
PostgreSQL by URL. A record too large for a batch comes in parts (`large_records.py`).

The store keeps a record until its reader removes it (`POST /records/delete`, admin only): a federated job's
collector removes each page of records once the updates they carried are committed to the job
(fleet/federated/collector.py), so the records and the parts of large ones do not pile up over a long job.
A record resent after its removal (a device that never saw its batch's answer) is stored again; its reader
knows its key and removes it without taking it twice.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa
import zstandard
from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field
from sqlalchemy.dialects import postgresql, sqlite
from starlette.concurrency import run_in_threadpool

from edgerun.json_limits import TooDeepError, loads_bounded
from edgerun.stream import large_records
from edgerun.stream.wire import MAX_BATCH_BYTES

MAX_RECORDS_PER_BATCH = 10_000
MAX_BATCH_DEPTH = 64  # a batch, its records and their payloads, together
PAGE_BYTES = 8 * 1024 * 1024  # a page of records in key order stops after the record that passes this
MAX_DELETE_KEYS = 200  # records removed by one request: 200 of the longest keys fit the 64 KiB body limit

metadata = sa.MetaData()

stream_records = sa.Table(
    "stream_records", metadata,
    sa.Column("record_id", sa.String(64), nullable=False),
    sa.Column("device_id", sa.String(200), nullable=False, index=True),
    sa.Column("task_id", sa.String(200), nullable=False, index=True),
    sa.Column("created_ms", sa.BigInteger, nullable=False),
    sa.Column("received_ms", sa.BigInteger, nullable=False),
    sa.Column("payload", sa.Text, nullable=False),
    # Named apart from the one-column key tables made before record ids were per device had, so the
    # migration below can build the new table beside the old one on PostgreSQL (index names are global).
    sa.PrimaryKeyConstraint("device_id", "record_id", name="stream_records_device_record_pkey"),
)

stream_batches = sa.Table(
    "stream_batches", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("device_id", sa.String(200), nullable=False),
    sa.Column("received_ms", sa.BigInteger, nullable=False),
    sa.Column("compressed_bytes", sa.Integer, nullable=False),
    sa.Column("records", sa.Integer, nullable=False),
    sa.Column("stored", sa.Integer, nullable=False),
    sa.Column("duplicates", sa.Integer, nullable=False),
)

stream_uploads, stream_parts, stream_refusals = large_records.table_definitions(metadata)

VerifyDevice = Callable[[str, str], bool]


def create_tables(engine: sa.Engine) -> None:
    _key_records_by_device(engine)
    try:
        metadata.create_all(engine)
    except sa.exc.DBAPIError:
        metadata.create_all(engine)  # another server process created them between the check and the create


def _key_records_by_device(engine: sa.Engine) -> None:
    """Tables made when record ids were global (primary key `record_id` alone) are rebuilt with the key
    (device_id, record_id), their rows kept, in one transaction."""
    inspector = sa.inspect(engine)
    if not inspector.has_table("stream_records"):
        return
    if inspector.get_pk_constraint("stream_records").get("constrained_columns") != ["record_id"]:
        return
    old_indexes = [ix["name"] for ix in inspector.get_indexes("stream_records") if ix.get("name")]
    with engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE stream_records RENAME TO stream_records_global_ids"))
        for name in old_indexes:
            conn.execute(sa.text(f'DROP INDEX IF EXISTS "{name}"'))
        stream_records.create(conn)
        columns = ", ".join(c.name for c in stream_records.columns)
        conn.execute(sa.text(f"INSERT INTO stream_records ({columns}) SELECT {columns} FROM stream_records_global_ids"))
        conn.execute(sa.text("DROP TABLE stream_records_global_ids"))


def _insert_ignoring_duplicates(dialect: str) -> Any:
    if dialect == "postgresql":
        return postgresql.insert(stream_records).on_conflict_do_nothing(index_elements=["device_id", "record_id"])
    if dialect == "sqlite":
        return sqlite.insert(stream_records).on_conflict_do_nothing(index_elements=["device_id", "record_id"])
    raise NotImplementedError(f"stream storage supports sqlite and postgresql, not {dialect}")


def _decompress_bounded(body: bytes, limit: int = MAX_BATCH_BYTES) -> bytes:
    """The zstd body decompressed, at most `limit` bytes of it. Read as a stream: a one-shot decompress
    allocates whatever size the frame header declares (a 100-byte body declaring 1.7 EB raised
    MemoryError, found by fuzz/targets.py::stream_batch), whatever `max_output_size` says."""
    out = bytearray()
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)) as reader:
            while chunk := reader.read(min(1 << 20, limit + 1 - len(out))):
                out += chunk
                if len(out) > limit:
                    raise HTTPException(413, "body too large once decompressed")
    except zstandard.ZstdError as exc:
        raise HTTPException(400, f"bad zstd body: {exc}") from exc
    return bytes(out)


def decode_body(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """A part's bytes: the body as sent, or decompressed (at most `limit`) when it says zstd."""
    return _decompress_bounded(body, limit) if (content_encoding or "").lower() == "zstd" else body


def decode_batch(body: bytes, content_encoding: str | None) -> dict[str, Any]:
    if (content_encoding or "").lower() == "zstd":
        body = _decompress_bounded(body)
    try:
        batch = loads_bounded(body, MAX_BATCH_DEPTH)
    except TooDeepError as exc:
        raise HTTPException(400, f"batch refused: {exc}") from exc
    except ValueError as exc:
        raise HTTPException(400, f"bad JSON body: {exc}") from exc
    if not isinstance(batch, dict) or not isinstance(batch.get("device_id"), str) \
            or not isinstance(batch.get("records"), list):
        raise HTTPException(400, "a batch is {'device_id': str, 'records': [...]}")
    if len(batch["records"]) > MAX_RECORDS_PER_BATCH:
        raise HTTPException(413, f"at most {MAX_RECORDS_PER_BATCH} records per batch")
    return batch


def _rows(device_id: str, records: list[Any], received_ms: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for record in records:
        try:
            rows.append({"record_id": str(record["record_id"]), "device_id": device_id,
                         "task_id": str(record["task_id"]), "created_ms": int(record["created_ms"]),
                         "received_ms": received_ms,
                         "payload": json.dumps(record["payload"], separators=(",", ":"), sort_keys=True)})
        except (KeyError, TypeError, ValueError) as exc:
            raise HTTPException(400, f"malformed record {record!r}: {exc}") from exc
        if not 0 < len(rows[-1]["record_id"]) <= 64:
            raise HTTPException(400, "record_id must be 1 to 64 characters")
    return rows


def store_batch(engine: sa.Engine, device_id: str, records: list[Any], compressed_bytes: int) -> dict[str, int]:
    """Stores a batch's records once each; returns how many were new and how many were seen before."""
    received_ms = time.time_ns() // 1_000_000
    rows = _rows(device_id, records, received_ms)
    unique = list({row["record_id"]: row for row in rows}.values())
    with engine.begin() as conn:
        stored = 0
        if unique:
            # RETURNING names the rows this statement inserted, so the count stays right when two server
            # processes store the same resent batch at the same moment.
            insert = _insert_ignoring_duplicates(engine.dialect.name).returning(stream_records.c.record_id)
            stored = len(conn.execute(insert, unique).all())
        result = {"stored": stored, "duplicates": len(rows) - stored}
        conn.execute(sa.insert(stream_batches).values(
            device_id=device_id, received_ms=received_ms, compressed_bytes=compressed_bytes,
            records=len(rows), **result))
    return result


class RecordKeys(BaseModel):
    """Records named by their keys, [device_id, record_id] each."""

    keys: list[tuple[str, str]] = Field(max_length=MAX_DELETE_KEYS)


def delete_records(engine: sa.Engine, keys: list[tuple[str, str]]) -> dict[str, int]:
    """Remove these records with every part and open upload under their keys, in one transaction; a key the
    store does not hold is skipped. Returns how many records and parts went."""
    if not keys:
        return {"records": 0, "parts": 0}
    with engine.begin() as conn:
        gone = {}
        for name, table in (("records", stream_records), ("parts", stream_parts), ("uploads", stream_uploads)):
            gone[name] = conn.execute(table.delete().where(
                sa.tuple_(table.c.device_id, table.c.record_id).in_(keys))).rowcount
    return {"records": gone["records"], "parts": gone["parts"]}


def _bearer(request: Request) -> str:
    auth = request.headers.get("authorization", "")
    if not auth.lower().startswith("bearer "):
        raise HTTPException(401, "missing bearer token")
    return auth[7:].strip()


def build_router(engine: sa.Engine, verify_device: VerifyDevice | None = None,
                 verify_admin: Callable[[str], bool] | None = None, page_bytes: int = PAGE_BYTES) -> APIRouter:
    """The /v1/stream routes on `engine`; a page of records in key order holds about `page_bytes` of payload.

    `verify_device(device_id, token)` checks a device's bearer token (the fleet passes its own device
    tokens). With it, uploads need the device's token, and reads need either an admin token
    (`verify_admin(token)`) or the token of the device named by `device_id=`, which then sees only its own
    records. Without it (tests, local demos) every request is accepted.
    """
    create_tables(engine)
    router = APIRouter(tags=["stream"])

    def authenticate(request: Request, device_id: str) -> None:
        if verify_device is not None and not verify_device(device_id, _bearer(request)):
            raise HTTPException(403, "this token does not belong to that device")

    def authorize_admin(request: Request) -> None:
        if verify_device is not None and not (verify_admin is not None and verify_admin(_bearer(request))):
            raise HTTPException(403, "admin token required")

    def authorize_read(request: Request, device_id: str | None) -> None:
        if verify_device is None:
            return
        token = _bearer(request)
        if verify_admin is not None and verify_admin(token):
            return
        if device_id is None or not verify_device(device_id, token):
            raise HTTPException(403, "reading needs an admin token, or a device token and that device's id")

    @router.post("/batches")
    async def receive_batch(request: Request) -> dict[str, int]:
        body = await request.body()
        batch = decode_batch(body, request.headers.get("content-encoding"))
        authenticate(request, batch["device_id"])
        # The database work is blocking; run it off the event loop as a sync endpoint would be.
        return await run_in_threadpool(store_batch, engine, batch["device_id"], batch["records"], len(body))

    large = large_records.LargeRecords(engine, stream_records, stream_uploads, stream_parts, stream_refusals)
    large_records.add_routes(router, large, authenticate, authorize_read, decode_body)

    @router.get("/records")
    def list_records(request: Request, task_id: str | None = None, device_id: str | None = None,
                     limit: int = 1000, after_device: str | None = None,
                     after_record: str | None = None) -> list[dict[str, Any]]:
        """Records in the order they arrived; or, given `after_device` ("" to begin), a page in key order
        (device_id, record_id) after that key: at most `limit` records and about `page_bytes` of payload, so a
        reader walks any number of records in bounded memory, the last record's key naming the next page.
        Key order is stable: a record committed late still lands in the walk's unread part or is found by
        the next walk, never skipped because of its arrival time."""
        authorize_read(request, device_id)
        paged = after_device is not None
        key = (stream_records.c.device_id, stream_records.c.record_id)
        query = sa.select(stream_records).order_by(*key) if paged else \
            sa.select(stream_records).order_by(stream_records.c.received_ms, stream_records.c.record_id)
        if paged:
            query = query.where(sa.tuple_(*key) > sa.tuple_(sa.literal(after_device), sa.literal(after_record or "")))
        if task_id is not None:
            query = query.where(stream_records.c.task_id == task_id)
        if device_id is not None:
            query = query.where(stream_records.c.device_id == device_id)
        out: list[dict[str, Any]] = []
        size = 0
        with engine.connect() as conn:
            rows = conn.execution_options(yield_per=64).execute(query.limit(max(1, min(limit, 100_000)))).mappings()
            for row in rows:
                out.append({**row, "payload": json.loads(row["payload"])})
                size += len(row["payload"])
                if paged and size > page_bytes:
                    rows.close()
                    break
        return out

    @router.post("/records/delete")
    def remove_records(body: RecordKeys, request: Request) -> dict[str, int]:
        """Remove records their reader has taken for good, with the parts of those uploaded in parts."""
        authorize_admin(request)
        return delete_records(engine, body.keys)

    @router.get("/stats")
    def stats(request: Request) -> dict[str, Any]:
        authorize_admin(request)
        with engine.connect() as conn:
            records = conn.execute(sa.select(sa.func.count()).select_from(stream_records)).scalar_one()
            batches = conn.execute(sa.select(
                sa.func.count(), sa.func.coalesce(sa.func.sum(stream_batches.c.duplicates), 0),
                sa.func.coalesce(sa.func.sum(stream_batches.c.compressed_bytes), 0))).one()
        return {"records": int(records), "batches": int(batches[0]), "duplicates_received": int(batches[1]),
                "compressed_bytes": int(batches[2]), "refused": large.refused()}

    return router
