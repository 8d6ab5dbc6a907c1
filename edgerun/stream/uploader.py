"""The device end of the tunnel: batches of stored outputs, zstd-compressed, POSTed over one keep-alive
connection, marked uploaded only after the cloud answered 200 (at-least-once; the cloud dedups by id).

A record whose JSON is larger than a batch may be (`max_batch_bytes`, the cloud's 16 MiB by default) goes
up alone in parts of `part_bytes` (the cloud end: `large_records.py`): the uploader asks which parts the cloud
holds, sends the others, and asks it to complete the record, which it does only once the whole hashes to
what was declared. A failure anywhere leaves the record pending; the next attempt (after a dropped
connection, or from an agent started again) sends only the parts the cloud still lacks.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import zstandard

from edgerun.errors import EdgerunError
from edgerun.stream.storage import REJECTED, UPLOADED, CollectiveStore, StoredRecord
from edgerun.stream.wire import MAX_BATCH_BYTES, MAX_PART_BYTES, part_count


class UploadError(EdgerunError):
    """A batch could not be delivered now; it stays in the buffer and is retried."""


@dataclass
class Backoff:
    """Exponential backoff with full jitter (AWS architecture blog): spreads a fleet's retries apart."""

    base_s: float = 0.5
    cap_s: float = 60.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0

    def next_delay(self) -> float:
        delay = self.rng.uniform(0, min(self.cap_s, self.base_s * 2 ** self.failures))
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


def encode_batch(device_id: str, records: list[StoredRecord], level: int = 3) -> bytes:
    body = json.dumps({"device_id": device_id, "records": [r.to_wire() for r in records]},
                      separators=(",", ":")).encode()
    return zstandard.ZstdCompressor(level=level).compress(body)


def payload_bytes(record: StoredRecord) -> bytes:
    """A record's payload as the parts carry it: the same bytes on every attempt, so a resumed upload's
    parts fit those sent before."""
    return json.dumps(record.payload, separators=(",", ":"), sort_keys=True).encode()


class Uploader:
    """Sends the store's pending records. `after_send(records)` runs after a 200 and before the records are
    marked: the window in which a kill makes the device resend (tests stop the process there);
    `after_part(index)` runs after the cloud kept a part of a large record (tests stop the process there)."""

    def __init__(self, store: CollectiveStore, upload_url: str, device_id: str,
                 token: str | Callable[[], str] | None = None, *,
                 batch_records: int = 200, level: int = 3, timeout_s: float = 10.0,
                 backoff: Backoff | None = None,
                 after_send: Callable[[list[StoredRecord]], None] | None = None,
                 max_batch_bytes: int = MAX_BATCH_BYTES, part_bytes: int = 8 * 1024 * 1024,
                 after_part: Callable[[int], None] | None = None) -> None:
        if not 0 < part_bytes <= MAX_PART_BYTES:
            raise EdgerunError(f"part_bytes must be 1 to {MAX_PART_BYTES}, got {part_bytes}")
        self.store = store
        self.base_url = upload_url.rstrip("/")
        self.url = self.base_url + "/batches"
        self.max_batch_bytes = max_batch_bytes
        self.part_bytes = part_bytes
        self.after_part = after_part
        self.parts_sent = 0
        self.device_id = device_id
        self.batch_records = batch_records
        self.level = level
        self.backoff = backoff or Backoff()
        self.after_send = after_send
        self.next_attempt_at = 0.0
        headers = {"Content-Encoding": "zstd", "Content-Type": "application/json", "X-Device-Id": device_id}
        # A callable token is read per request: the agent enrols (and gets its token) after it builds us.
        self._token = token
        self._client = httpx.Client(headers=headers, timeout=timeout_s)
        self.bytes_sent = 0

    def _request(self, method: str, url: str, *, content: bytes | None = None, body_json: object = None,
                 params: dict[str, str] | None = None, extra_headers: dict[str, str] | None = None) -> httpx.Response:
        token = self._token() if callable(self._token) else self._token
        headers = {**({"Authorization": f"Bearer {token}"} if token else {}), **(extra_headers or {})}
        if body_json is not None:  # the client's default headers say zstd, for batches
            headers["Content-Encoding"] = "identity"
        try:
            return self._client.request(method, url, content=content, json=body_json, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise UploadError(f"upload to {url} failed: {exc!r}") from exc

    @staticmethod
    def _retryable(response: httpx.Response) -> bool:
        # Auth failures are retried, not dropped: a device whose token is being re-issued must not lose data.
        return response.status_code in (401, 403, 408, 429) or response.status_code >= 500

    def send_batch(self, records: list[StoredRecord]) -> None:
        """One POST; raises UploadError on a failure worth retrying."""
        if len(records) == 1 and len(payload_bytes(records[0])) > self.max_batch_bytes:
            self.send_large(records[0])
            return
        body = encode_batch(self.device_id, records, self.level)
        response = self._request("POST", self.url, content=body)
        self.bytes_sent += len(body)
        if response.status_code == 413:
            if len(records) > 1:
                half = len(records) // 2
                self.send_batch(records[:half])
                self.send_batch(records[half:])
            else:  # larger than this cloud takes in a batch
                self.send_large(records[0])
            return
        if self._retryable(response):
            raise UploadError(f"upload to {self.url}: HTTP {response.status_code}")
        if response.status_code >= 400:
            # The cloud will never take this batch; keeping it would block every later record.
            self.store.mark([r.seq for r in records], REJECTED)
            return
        if self.after_send is not None:
            self.after_send(records)
        self.store.mark([r.seq for r in records], UPLOADED)

    def send_large(self, record: StoredRecord) -> None:
        """One record in parts; raises UploadError on a failure worth retrying (the next try resumes)."""
        data = payload_bytes(record)
        start = {"device_id": self.device_id, "record_id": record.record_id, "task_id": record.task_id,
                 "created_ms": record.created_ms, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                 "part_bytes": self.part_bytes}
        response = self._request("POST", self.base_url + "/large", body_json=start)
        if response.status_code >= 400 and not self._retryable(response):
            self.store.mark([record.seq], REJECTED)  # the cloud will never take this record (its id, its size)
            return
        if response.status_code == 200 and response.json()["state"] == "open":
            have = set(response.json()["have"])
            compressor = zstandard.ZstdCompressor(level=self.level)
            for index in range(part_count(len(data), self.part_bytes)):
                if index in have:
                    continue
                part = data[index * self.part_bytes:(index + 1) * self.part_bytes]
                body = compressor.compress(part)
                response = self._request(
                    "PUT", f"{self.base_url}/large/parts/{index}", content=body,
                    params={"device_id": self.device_id, "record_id": record.record_id},
                    extra_headers={"X-Part-Sha256": hashlib.sha256(part).hexdigest()})
                if response.status_code != 200:
                    raise UploadError(f"part {index} of {record.record_id!r}: HTTP {response.status_code} "
                                      f"{response.text[:200]}")
                self.bytes_sent += len(body)
                self.parts_sent += 1
                if self.after_part is not None:
                    self.after_part(index)
            response = self._request("POST", self.base_url + "/large/complete",
                                     body_json={"device_id": self.device_id, "record_id": record.record_id})
        if self._retryable(response) or response.status_code in (404, 409, 422):
            # 404/409: the cloud lost the upload or a part (another replica, a cleanup); 422: a part or the
            # whole failed its checksum, and the cloud dropped what it could not trust. Start again later.
            raise UploadError(f"record {record.record_id!r} in parts: HTTP {response.status_code} {response.text[:200]}")
        if response.status_code >= 400:
            self.store.mark([record.seq], REJECTED)
            return
        if self.after_send is not None:
            self.after_send([record])
        self.store.mark([record.seq], UPLOADED)

    def upload_ready(self) -> int:
        """Sends pending batches until the buffer is empty or a send fails; never sleeps. Returns records sent."""
        if time.monotonic() < self.next_attempt_at:
            return 0
        sent = 0
        while True:
            records = self.store.pending_batch(self.batch_records, self.max_batch_bytes)
            if not records:
                return sent
            try:
                self.send_batch(records)
            except UploadError:
                self.store.bump("upload_retries")
                self.next_attempt_at = time.monotonic() + self.backoff.next_delay()
                return sent
            self.backoff.reset()
            self.next_attempt_at = 0.0
            sent += len(records)

    def upload_all(self, timeout_s: float = 30.0) -> int:
        """Sends everything pending, sleeping through backoff; raises UploadError past the timeout."""
        deadline = time.monotonic() + timeout_s
        sent = 0
        while True:
            sent += self.upload_ready()
            if self.store.pending_count() == 0:
                return sent
            wait = self.next_attempt_at - time.monotonic()
            if time.monotonic() + max(wait, 0) > deadline:
                raise UploadError(f"{self.store.pending_count()} records still pending after {timeout_s}s")
            if wait > 0:
                time.sleep(wait)

    def close(self) -> None:
        self._client.close()
