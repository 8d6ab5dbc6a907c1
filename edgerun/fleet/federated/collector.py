"""The server side of the upload: read the job's update records from the stream tunnel's cloud store and
hand each to the job once (rounds.py). Record ids the job has handled are kept in the fleet database
(`fed_records`), so a collector started again reads on without counting anything twice."""

from __future__ import annotations

from collections import Counter
from typing import Any

import httpx
import sqlalchemy as sa

from edgerun.fleet.federated import round_store as db
from edgerun.fleet.federated.rounds import FederatedJob
from edgerun.fleet.federated.training_task import decode_arrays


def fetch_records(server_url: str, admin_token: str, job: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{server_url.rstrip('/')}/v1/stream/records", params={"task_id": job, "limit": 100_000},
                  headers={"Authorization": f"Bearer {admin_token}"}, timeout=60)
    r.raise_for_status()
    return list(r.json())


def collect(job: FederatedJob, records: list[dict[str, Any]], now: float) -> Counter[str]:
    """Offer every record not handled before to the job; returns the verdicts of this call."""
    verdicts: Counter[str] = Counter()
    with job.engine.connect() as conn:
        handled = {(r.device, r.record_id) for r in conn.execute(
            sa.select(db.records.c.device, db.records.c.record_id).where(db.records.c.job == job.name))}
    for record in records:
        key = (str(record["device_id"]), str(record["record_id"]))
        if key in handled:
            continue
        payload = record.get("payload") or {}
        try:
            packed = decode_arrays(str(payload["update"]))
            round_number, samples = int(payload["round"]), payload["samples"]
        except (KeyError, ValueError, TypeError):
            verdict = "malformed"
        else:
            verdict = job.receive(key[0], round_number, packed, samples, now)
        with job.engine.begin() as conn:
            conn.execute(db.records.insert().values(job=job.name, device=key[0], record_id=key[1], verdict=verdict))
        handled.add(key)
        verdicts[verdict] += 1
    return verdicts
