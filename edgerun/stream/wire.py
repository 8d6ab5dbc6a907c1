"""The tunnel's sizes and the one shape both ends read, shared by the device end (uploader.py), the cloud end
(cloud.py, large_records.py) and its readers, without the device importing the server's libraries."""

from __future__ import annotations

from typing import Any

MAX_BATCH_BYTES = 16 * 1024 * 1024  # decompressed; a zstd bomb must not exhaust the server's memory
MAX_PART_BYTES = MAX_BATCH_BYTES    # a part of a record too large for a batch, decompressed
LARGE_KEY = "$large"  # the key of the reference a large record's row holds in place of its payload


def part_count(total: int, part_bytes: int) -> int:
    """How many parts of `part_bytes` (the last one shorter) carry `total` bytes."""
    return -(-total // part_bytes)


def large_reference(payload: Any) -> dict[str, Any] | None:
    """The {"bytes", "sha256", "parts"} of a record read from /records whose payload came in parts, else None
    (its payload is then the record's own)."""
    ref = payload.get(LARGE_KEY) if isinstance(payload, dict) and len(payload) == 1 else None
    return ref if isinstance(ref, dict) else None
