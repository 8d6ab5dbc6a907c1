"""The server side of the upload: read the job's update records from the stream tunnel's cloud store, hand
each to the job once (rounds.py), then remove them from the store. Record ids the job has handled are kept in
the fleet database (`fed_records`, written in the same transaction as the updates they carried), so a
collector started again reads on without counting anything twice.

A page's records are removed from the store (`POST /v1/stream/records/delete`, with the parts of large ones)
only after the transaction recording them committed: a crash before it leaves them to be read again, a crash
after it leaves records that the next tick finds in `fed_records`, removes and does not offer. So the store
holds only what has not been collected yet, a tick reads only records that arrived since the last one
(`StreamRecords.read` counts them), and a long job does not grow the fleet database by its updates.

Records are read in pages in key order (`/v1/stream/records?after_device=...`: at most `page_records`
records and about 8 MiB of payload a page), and a record uploaded in parts (a large update:
stream/large_records.py) is fetched alone when its turn comes. The job adds each accepted update to the
round's running sum as it is read (`FederatedJob.receive_many`), so collecting a round needs one page of
small records or one large update in memory, whatever the number of devices.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Any

import httpx
import sqlalchemy as sa

from edgerun.fleet.federated import round_store as db
from edgerun.fleet.federated.rounds import FederatedJob, Offer
from edgerun.fleet.federated.training_task import decode_arrays
from edgerun.stream.cloud import MAX_DELETE_KEYS
from edgerun.stream.wire import large_reference

PAGE_RECORDS = 100


class StreamRecords:
    """A job's records on a fleet server's /v1/stream, read page by page with the admin token. Iterating
    gives every record as listed (a large one's payload is its reference); `payload(record)` the payload
    itself."""

    def __init__(self, server_url: str, admin_token: str, job: str, page_records: int = PAGE_RECORDS,
                 timeout_s: float = 120.0) -> None:
        self.url = server_url.rstrip("/") + "/v1/stream"
        self.job, self.page_records = job, page_records
        self.headers = {"Authorization": f"Bearer {admin_token}"}
        self.timeout_s = timeout_s
        self.read = 0  # records listed so far
        self.removed = {"records": 0, "parts": 0}  # what remove() took out of the store so far

    def pages(self) -> Iterator[list[dict[str, Any]]]:
        after = ("", "")
        with httpx.Client(headers=self.headers, timeout=self.timeout_s) as client:
            while True:
                r = client.get(f"{self.url}/records", params={
                    "task_id": self.job, "after_device": after[0], "after_record": after[1],
                    "limit": self.page_records})
                r.raise_for_status()
                page = list(r.json())
                if not page:
                    return
                self.read += len(page)
                yield page
                after = (str(page[-1]["device_id"]), str(page[-1]["record_id"]))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for page in self.pages():
            yield from page

    def payload(self, record: dict[str, Any]) -> Any:
        if large_reference(record.get("payload")) is None:
            return record.get("payload")
        r = httpx.get(f"{self.url}/large/payload", params={"device_id": record["device_id"],
                                                           "record_id": record["record_id"]},
                      headers=self.headers, timeout=self.timeout_s)
        r.raise_for_status()
        return json.loads(r.content)

    def remove(self, records: Iterable[dict[str, Any]]) -> None:
        """Remove these records from the store, with the parts of those uploaded in parts."""
        keys = [[str(r["device_id"]), str(r["record_id"])] for r in records]
        with httpx.Client(headers=self.headers, timeout=self.timeout_s) as client:
            for start in range(0, len(keys), MAX_DELETE_KEYS):
                r = client.post(f"{self.url}/records/delete", json={"keys": keys[start:start + MAX_DELETE_KEYS]})
                r.raise_for_status()
                for name, count in r.json().items():
                    self.removed[name] = self.removed.get(name, 0) + int(count)


def fetch_records(server_url: str, admin_token: str, job: str) -> StreamRecords:
    return StreamRecords(server_url, admin_token, job)


def _pages(records: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    if isinstance(records, StreamRecords):
        yield from records.pages()
        return
    it = iter(records)
    while page := list(islice(it, PAGE_RECORDS)):
        yield page


def _offer(records: Iterable[dict[str, Any]], record: dict[str, Any]) -> Offer:
    """The record as the job takes it; its payload (a large one downloaded now) is gone once this returns."""
    device, rid = str(record["device_id"]), str(record["record_id"])
    try:
        payload = records.payload(record) if isinstance(records, StreamRecords) else record.get("payload")
        payload = payload or {}
        packed = decode_arrays(str(payload["update"]))
        round_number, samples = int(payload["round"]), payload["samples"]
    except (KeyError, ValueError, TypeError, AttributeError):
        return Offer(device, -1, None, None, record_id=rid)  # refused as malformed if its round is open
    return Offer(device, round_number, packed, samples, record_id=rid)


def _handled(job: FederatedJob, page: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The keys among `page`'s that the job has recorded already."""
    keys = {(str(r["device_id"]), str(r["record_id"])) for r in page}
    with job.engine.connect() as conn:
        return {(r.device, r.record_id) for r in conn.execute(
            sa.select(db.records.c.device, db.records.c.record_id).where(
                (db.records.c.job == job.name) & sa.tuple_(db.records.c.device, db.records.c.record_id).in_(keys)))}


def collect(job: FederatedJob, records: Iterable[dict[str, Any]], now: float,
            on_page: Callable[[Counter[str]], None] | None = None) -> Counter[str]:
    """Offer every record not handled before to the job, a page at a time; returns the verdicts of this call.
    `records` is `fetch_records(...)` (pages from the server, each removed from the store once recorded) or
    any iterable of records (tests; nothing is removed); `on_page(verdicts so far)` runs after each page with
    new records is recorded and before it is removed (progress, measurements)."""
    verdicts: Counter[str] = Counter()
    for page in _pages(records):
        handled = _handled(job, page)
        fresh = [r for r in page if (str(r["device_id"]), str(r["record_id"])) not in handled]
        if fresh:
            verdicts.update(job.receive_many((_offer(records, r) for r in fresh), now))  # committed on return
            if on_page is not None:
                on_page(verdicts)
        if isinstance(records, StreamRecords):
            records.remove(page)
    return verdicts
