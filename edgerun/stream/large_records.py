"""The cloud end of records too large for one batch, uploaded in parts: a federated update of a MiniLM-sized
model is about 115 MiB of JSON, past a batch's 16 MiB (`cloud.MAX_BATCH_BYTES`).

The device (`uploader.Uploader`) names the record and its payload's length and SHA-256, learns which parts the
cloud already holds, sends the others (each checked against its own SHA-256 on arrival), then asks the cloud to
complete it. Completing reads the parts in order, checks the whole's length and SHA-256 against what the
upload declared and only then inserts the record, so a reader never sees a partial or altered payload. The
parts are kept in the database (`stream_parts`) as the payload's storage: any server process sharing the
database can take any part, and a device that dropped its connection or restarted resumes where the cloud
stands, sending only what is missing. The record's row (`stream_records`) carries a reference in place of its
payload, `{"$large": {"bytes", "sha256", "parts"}}`; `GET /v1/stream/large/payload` streams the bytes.

Exactly once: the record is inserted with the same (device_id, record_id) key and conflict rule as a batch's,
and an upload of a record the cloud already holds is answered "stored" before any part is sent. Refusals
(a part whose bytes do not hash to what the device said, a part of the wrong length, a whole whose SHA-256
differs) are answered 422 and counted by reason in `stream_refusals` (shown by `/v1/stream/stats`).
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa
from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, Field
from sqlalchemy.dialects import postgresql, sqlite
from starlette.concurrency import run_in_threadpool

from edgerun.stream.wire import LARGE_KEY, MAX_PART_BYTES, large_reference, part_count

MAX_PART_BODY = MAX_PART_BYTES + 65536   # zstd can make incompressible bytes a little longer
MAX_LARGE_BYTES = 4 * 1024 * 1024 * 1024  # one record's payload
REFUSAL_REASONS = ("part_checksum", "part_length", "part_index", "payload_checksum")
_SHA = re.compile(r"^[0-9a-f]{64}$")


def table_definitions(metadata: sa.MetaData) -> tuple[sa.Table, sa.Table, sa.Table]:
    uploads = sa.Table(
        "stream_uploads", metadata,
        sa.Column("device_id", sa.String(200), primary_key=True),
        sa.Column("record_id", sa.String(64), primary_key=True),
        sa.Column("task_id", sa.String(200), nullable=False),
        sa.Column("created_ms", sa.BigInteger, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("part_bytes", sa.Integer, nullable=False),
        sa.Column("started_ms", sa.BigInteger, nullable=False),
    )
    parts = sa.Table(
        "stream_parts", metadata,
        sa.Column("device_id", sa.String(200), primary_key=True),
        sa.Column("record_id", sa.String(64), primary_key=True),
        sa.Column("idx", sa.Integer, primary_key=True),
        sa.Column("data", sa.LargeBinary, nullable=False),
    )
    refusals = sa.Table(
        "stream_refusals", metadata,
        sa.Column("reason", sa.String(32), primary_key=True),
        sa.Column("count", sa.BigInteger, nullable=False),
    )
    return uploads, parts, refusals


class UploadStart(BaseModel):
    device_id: str = Field(min_length=1, max_length=200)
    record_id: str = Field(min_length=1, max_length=64)
    task_id: str = Field(min_length=1, max_length=200)
    created_ms: int
    bytes: int = Field(gt=0, le=MAX_LARGE_BYTES)
    sha256: str = Field(pattern=_SHA.pattern)
    part_bytes: int = Field(gt=0, le=MAX_PART_BYTES)


class UploadKey(BaseModel):
    device_id: str = Field(min_length=1, max_length=200)
    record_id: str = Field(min_length=1, max_length=64)


def _upsert_insert(dialect: str, table: sa.Table) -> Any:
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise NotImplementedError(f"stream storage supports sqlite and postgresql, not {dialect}")


class LargeRecords:
    """The part store over the stream tables; `records` is `cloud.stream_records` (the completed records)."""

    def __init__(self, engine: sa.Engine, records: sa.Table, uploads: sa.Table, parts: sa.Table,
                 refusals: sa.Table) -> None:
        self.engine, self.records = engine, records
        self.uploads, self.parts, self.refusals = uploads, parts, refusals

    def _refuse(self, reason: str, detail: str) -> HTTPException:
        insert = _upsert_insert(self.engine.dialect.name, self.refusals).values(reason=reason, count=1)
        with self.engine.begin() as conn:
            conn.execute(insert.on_conflict_do_update(index_elements=["reason"],
                                                      set_={"count": self.refusals.c.count + 1}))
        return HTTPException(422, f"{reason}: {detail}")

    def _key(self, table: sa.Table, device_id: str, record_id: str) -> Any:
        return (table.c.device_id == device_id) & (table.c.record_id == record_id)

    def start(self, body: UploadStart) -> dict[str, Any]:
        """Open (or find) the upload of a record; says which parts are held already."""
        with self.engine.begin() as conn:
            if conn.execute(sa.select(self.records.c.record_id).where(
                    self._key(self.records, body.device_id, body.record_id))).first() is not None:
                return {"state": "stored", "have": []}
            held = conn.execute(sa.select(self.uploads).where(
                self._key(self.uploads, body.device_id, body.record_id))).first()
            if held is not None and (held.bytes, held.sha256, held.part_bytes) != (body.bytes, body.sha256,
                                                                                body.part_bytes):
                held = None  # another payload under the same id: its parts are of no use
                conn.execute(self.parts.delete().where(self._key(self.parts, body.device_id, body.record_id)))
                conn.execute(self.uploads.delete().where(self._key(self.uploads, body.device_id, body.record_id)))
            if held is None:
                conn.execute(self.uploads.insert().values(**body.model_dump(), started_ms=time.time_ns() // 1_000_000))
            have = conn.execute(sa.select(self.parts.c.idx).where(
                self._key(self.parts, body.device_id, body.record_id)).order_by(self.parts.c.idx)).scalars().all()
        return {"state": "open", "have": list(have)}

    def _upload(self, conn: sa.Connection, device_id: str, record_id: str) -> Any:
        row = conn.execute(sa.select(self.uploads).where(self._key(self.uploads, device_id, record_id))).first()
        if row is None:
            raise HTTPException(404, f"no upload of record {record_id!r} is open for {device_id!r}: start it first")
        return row

    def put_part(self, device_id: str, record_id: str, index: int, data: bytes, sha256: str) -> dict[str, int]:
        """Keep one part, once: refused (and counted) unless it has its place's length and hashes to `sha256`."""
        with self.engine.connect() as conn:
            upload = self._upload(conn, device_id, record_id)
        count = part_count(upload.bytes, upload.part_bytes)
        if not 0 <= index < count:
            raise self._refuse("part_index", f"part {index} of a {count}-part upload")
        expected = upload.part_bytes if index < count - 1 else upload.bytes - upload.part_bytes * (count - 1)
        if len(data) != expected:
            raise self._refuse("part_length", f"part {index} has {len(data)} bytes, not {expected}")
        if hashlib.sha256(data).hexdigest() != sha256:
            raise self._refuse("part_checksum", f"part {index} does not hash to the SHA-256 sent with it")
        insert = _upsert_insert(self.engine.dialect.name, self.parts).values(
            device_id=device_id, record_id=record_id, idx=index, data=data)
        with self.engine.begin() as conn:
            stored = conn.execute(insert.on_conflict_do_nothing(
                index_elements=["device_id", "record_id", "idx"]).returning(self.parts.c.idx)).all()
        return {"stored": len(stored)}

    def _read_parts(self, device_id: str, record_id: str, count: int) -> Iterator[bytes]:
        """The parts in order, one in memory at a time."""
        for index in range(count):
            with self.engine.connect() as conn:
                data = conn.execute(sa.select(self.parts.c.data).where(
                    self._key(self.parts, device_id, record_id) & (self.parts.c.idx == index))).scalar()
            if data is None:
                raise HTTPException(409, f"part {index} of {count} has not arrived")
            yield bytes(data)

    def complete(self, key: UploadKey) -> dict[str, int]:
        """Check the whole against the upload's length and SHA-256, then store the record (once)."""
        with self.engine.connect() as conn:
            if conn.execute(sa.select(self.records.c.record_id).where(
                    self._key(self.records, key.device_id, key.record_id))).first() is not None:
                return {"stored": 0, "duplicates": 1}
            upload = self._upload(conn, key.device_id, key.record_id)
        count = part_count(upload.bytes, upload.part_bytes)
        digest, length = hashlib.sha256(), 0
        for data in self._read_parts(key.device_id, key.record_id, count):
            digest.update(data)
            length += len(data)
        if length != upload.bytes or digest.hexdigest() != upload.sha256:
            with self.engine.begin() as conn:  # the device sends them all again
                conn.execute(self.parts.delete().where(self._key(self.parts, key.device_id, key.record_id)))
            raise self._refuse("payload_checksum", f"the {count} parts do not make the payload declared")
        reference = {LARGE_KEY: {"bytes": upload.bytes, "sha256": upload.sha256, "parts": count}}
        row = {"record_id": key.record_id, "device_id": key.device_id, "task_id": upload.task_id,
               "created_ms": upload.created_ms, "received_ms": time.time_ns() // 1_000_000,
               "payload": json.dumps(reference, separators=(",", ":"), sort_keys=True)}
        insert = _upsert_insert(self.engine.dialect.name, self.records).values(**row)
        with self.engine.begin() as conn:
            stored = len(conn.execute(insert.on_conflict_do_nothing(
                index_elements=["device_id", "record_id"]).returning(self.records.c.record_id)).all())
            conn.execute(self.uploads.delete().where(self._key(self.uploads, key.device_id, key.record_id)))
        return {"stored": stored, "duplicates": 1 - stored}

    def payload(self, device_id: str, record_id: str) -> Iterator[bytes]:
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(self.records.c.payload).where(
                self._key(self.records, device_id, record_id))).first()
        ref = large_reference(json.loads(row.payload)) if row is not None else None
        if ref is None:
            raise HTTPException(404, f"{device_id!r} has no record {record_id!r} uploaded in parts")
        return self._read_parts(device_id, record_id, int(ref["parts"]))

    def refused(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return {r.reason: int(r._mapping["count"]) for r in conn.execute(sa.select(self.refusals))}


def add_routes(router: APIRouter, large: LargeRecords, authenticate: Callable[[Request, str], None],
               authorize_read: Callable[[Request, str | None], None],
               decompress: Callable[[bytes, str | None, int], bytes]) -> None:
    """The /large routes on the stream router; each needs the named device's token (reads: or an admin's)."""

    @router.post("/large")
    def start_upload(body: UploadStart, request: Request) -> dict[str, Any]:
        authenticate(request, body.device_id)
        return large.start(body)

    @router.put("/large/parts/{index}")
    async def put_part(index: int, device_id: str, record_id: str, request: Request) -> dict[str, int]:
        authenticate(request, device_id)
        sha = request.headers.get("x-part-sha256", "")
        if not _SHA.match(sha):
            raise HTTPException(400, "X-Part-Sha256 must be the part's SHA-256 in hex")
        data = decompress(await request.body(), request.headers.get("content-encoding"), MAX_PART_BYTES)
        return await run_in_threadpool(large.put_part, device_id, record_id, index, data, sha)

    @router.post("/large/complete")
    def complete_upload(body: UploadKey, request: Request) -> dict[str, int]:
        authenticate(request, body.device_id)
        return large.complete(body)

    @router.get("/large/payload")
    def read_payload(device_id: str, record_id: str, request: Request) -> StreamingResponse:
        authorize_read(request, device_id)
        return StreamingResponse(large.payload(device_id, record_id), media_type="application/json")
