"""The device end of the tunnel: batches of stored outputs, zstd-compressed, POSTed over one keep-alive
connection, marked uploaded only after the cloud answered 200 (at-least-once; the cloud dedups by id).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import zstandard

from edgerun.errors import EdgerunError
from edgerun.stream.storage import REJECTED, UPLOADED, CollectiveStore, StoredRecord


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


class Uploader:
    """Sends the store's pending records. `after_send(records)` runs after a 200 and before the records are
    marked: the window in which a kill makes the device resend (tests stop the process there)."""

    def __init__(self, store: CollectiveStore, upload_url: str, device_id: str,
                 token: str | Callable[[], str] | None = None, *,
                 batch_records: int = 200, level: int = 3, timeout_s: float = 10.0,
                 backoff: Backoff | None = None,
                 after_send: Callable[[list[StoredRecord]], None] | None = None) -> None:
        self.store = store
        self.url = upload_url.rstrip("/") + "/batches"
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

    def send_batch(self, records: list[StoredRecord]) -> None:
        """One POST; raises UploadError on a failure worth retrying."""
        body = encode_batch(self.device_id, records, self.level)
        try:
            token = self._token() if callable(self._token) else self._token
            headers = {"Authorization": f"Bearer {token}"} if token else None
            response = self._client.post(self.url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise UploadError(f"upload to {self.url} failed: {exc!r}") from exc
        self.bytes_sent += len(body)
        if response.status_code == 413 and len(records) > 1:
            half = len(records) // 2
            self.send_batch(records[:half])
            self.send_batch(records[half:])
            return
        # Auth failures are retried, not dropped: a device whose token is being re-issued must not lose data.
        if response.status_code in (401, 403, 408, 429) or response.status_code >= 500:
            raise UploadError(f"upload to {self.url}: HTTP {response.status_code}")
        if response.status_code >= 400:
            # The cloud will never take this batch; keeping it would block every later record.
            self.store.mark([r.seq for r in records], REJECTED)
            return
        if self.after_send is not None:
            self.after_send(records)
        self.store.mark([r.seq for r in records], UPLOADED)

    def upload_ready(self) -> int:
        """Sends pending batches until the buffer is empty or a send fails; never sleeps. Returns records sent."""
        if time.monotonic() < self.next_attempt_at:
            return 0
        sent = 0
        while True:
            records = self.store.pending_batch(self.batch_records)
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
