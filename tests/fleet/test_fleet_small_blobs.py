"""The server's in-memory copies of small blobs (blob_response.SmallBlobs), against a real folder store."""

from __future__ import annotations

import hashlib
from pathlib import Path

from edgerun.fleet.blob_response import SmallBlobs
from edgerun.fleet.store import LocalBlobStore


def put(store: LocalBlobStore, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    store.put(digest, data)
    return digest


def test_small_blobs_are_held_large_or_damaged_ones_never(tmp_path: Path) -> None:
    store = LocalBlobStore(tmp_path / "blobs")
    blobs = SmallBlobs(max_blob=1000, max_total=2500)
    small, large = put(store, b"a" * 900), put(store, b"b" * 1001)
    assert blobs.get(small) is None
    assert blobs.load(store, small) == b"a" * 900
    assert blobs.get(small) == b"a" * 900
    assert blobs.load(store, large) is None and blobs.get(large) is None
    assert blobs.load(store, "0" * 64) is None  # not in the store

    damaged = put(store, b"c" * 900)
    path = store.local_path(damaged)
    assert path is not None
    path.write_bytes(b"d" * 900)  # same length, other bytes
    assert blobs.load(store, damaged) is None and blobs.get(damaged) is None
    path.write_bytes(b"c" * 900)  # repaired: held from now on
    assert blobs.load(store, damaged) == b"c" * 900

    third = put(store, b"e" * 900)  # 2,700 bytes held would pass 2,500: the least recently served goes
    blobs.get(small)
    assert blobs.load(store, third) == b"e" * 900
    assert blobs.get(damaged) is None
    assert blobs.get(small) == b"a" * 900 and blobs.get(third) == b"e" * 900
