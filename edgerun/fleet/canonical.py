"""Canonical JSON: the exact bytes that get signed, so signer and verifier agree on every byte."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any


def canonical_bytes(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def iso_after(seconds: float, now: dt.datetime | None = None) -> str:
    """An ISO-8601 UTC timestamp `seconds` from now, as written into metadata `expires` fields."""
    base = now or utc_now()
    return (base + dt.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(value: str) -> dt.datetime:
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
