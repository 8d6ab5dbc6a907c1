"""The weight segment table: where each constant's bytes lie in the data region, and how to check them.

Offsets are relative to the start of the data region. Every segment starts on an ALIGNMENT boundary, its
length is exactly shape × itemsize (a string segment's is its encoding's, string_segment.py), and segments never partially overlap. Two entries may point at the very
same bytes (same offset and length): the writer stores identical weights once, e.g. tied embeddings.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgerun.errors import ProgramFormatError
from edgerun.ir.dtypes import DType
from edgerun.program.canonical_json import check_string
from edgerun.program.format import ALIGNMENT, MAX_VALUES
from edgerun.program.graph_codec import check_int, check_keys, check_list, decode_dtype, decode_shape

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class SegmentEntry:
    name: str
    dtype: DType
    shape: tuple[int, ...]
    offset: int
    nbytes: int
    sha256: str  # hex digest of the segment's bytes

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.value, "shape": list(self.shape),
                "offset": self.offset, "nbytes": self.nbytes, "sha256": self.sha256}

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


def _decode_entry(obj: object, index: int, data_length: int, allow_unknown: bool) -> SegmentEntry:
    what = f"segment {index}"
    e = check_keys(obj, what, ("name", "dtype", "shape", "offset", "nbytes", "sha256"), (), allow_unknown)
    name = check_string(e["name"], f"{what} name")
    if not name:
        raise ProgramFormatError(f"{what} has an empty name")
    what = f"segment {index} ({name[:80]!r})"
    dtype = decode_dtype(e["dtype"], what)
    shape = decode_shape(e["shape"], what)
    offset = check_int(e["offset"], f"{what} offset", 0, data_length)
    nbytes = check_int(e["nbytes"], f"{what} nbytes", 0, data_length - offset)
    if offset % ALIGNMENT:
        raise ProgramFormatError(f"{what} offset {offset} is not a multiple of {ALIGNMENT}")
    entry = SegmentEntry(name, dtype, shape, offset, nbytes, "")
    if dtype is not DType.string and entry.numel * dtype.itemsize != nbytes:  # strings: string_segment.py
        raise ProgramFormatError(f"{what}: shape {list(shape)} of {dtype.value} needs "
                                 f"{entry.numel * dtype.itemsize} bytes, the segment has {nbytes}")
    digest = e["sha256"]
    if type(digest) is not str or not _SHA256_HEX.fullmatch(digest):
        raise ProgramFormatError(f"{what} sha256 must be 64 lower-case hex digits")
    return SegmentEntry(name, dtype, shape, offset, nbytes, digest)


def decode_segment_table(obj: object, data_length: int, allow_unknown: bool = False) -> list[SegmentEntry]:
    """Validate the table against a data region of data_length bytes: bounds, alignment, sizes, overlaps."""
    entries = [_decode_entry(e, i, data_length, allow_unknown)
               for i, e in enumerate(check_list(obj, "segment table", MAX_VALUES))]
    names: set[str] = set()
    for e in entries:
        if e.name in names:
            raise ProgramFormatError(f"segment name {e.name[:80]!r} appears twice in the segment table")
        names.add(e.name)
    previous: SegmentEntry | None = None
    furthest: SegmentEntry | None = None  # the segment reaching furthest so far
    for e in sorted((e for e in entries if e.nbytes), key=lambda e: (e.offset, e.nbytes)):
        shared = previous is not None and (e.offset, e.nbytes, e.sha256) == (
            previous.offset, previous.nbytes, previous.sha256)
        if furthest is not None and not shared and e.offset < furthest.offset + furthest.nbytes:
            raise ProgramFormatError(
                f"segment {e.name[:80]!r} at [{e.offset}, {e.offset + e.nbytes}) overlaps segment "
                f"{furthest.name[:80]!r} at [{furthest.offset}, {furthest.offset + furthest.nbytes})")
        if furthest is None or e.offset + e.nbytes > furthest.offset + furthest.nbytes:
            furthest = e
        previous = e
    return entries


def verify_data_region(region: memoryview, entries: list[SegmentEntry],
                       hashed: Callable[[int], None] | None = None) -> None:
    """Hash every segment against the table, and check that padding is zero and bool bytes are 0 or 1.

    Checking the padding means every byte of the file is covered by some check, so any bit flip is caught.
    `hashed(end)` is told after each segment, in file order, that the bytes before `end` were read (a
    mapped file's reader gives their pages back as it goes).
    """
    verified: dict[tuple[int, int], str] = {}
    for e in sorted(entries, key=lambda e: e.offset):
        key = (e.offset, e.nbytes)
        if key not in verified:
            verified[key] = hashlib.sha256(region[e.offset:e.offset + e.nbytes]).hexdigest()
            if hashed is not None:
                hashed(e.offset + e.nbytes)
        if verified[key] != e.sha256:
            raise ProgramFormatError(f"checksum mismatch in weight segment {e.name[:80]!r}: the file is corrupted")
        if e.dtype is DType.bool and e.nbytes:
            as_bytes = np.frombuffer(region, np.uint8, e.nbytes, e.offset)
            if int(as_bytes.max()) > 1:
                raise ProgramFormatError(f"bool segment {e.name[:80]!r} holds bytes other than 0 and 1")
    position = 0
    for offset, nbytes in sorted(verified):
        _check_zero(region, position, offset)
        position = max(position, offset + nbytes)
    _check_zero(region, position, len(region))


def _check_zero(region: memoryview, start: int, end: int) -> None:
    if end > start and np.frombuffer(region, np.uint8, end - start, start).any():
        raise ProgramFormatError(f"padding bytes in the data region at [{start}, {end}) are not zero: "
                                 "the file is corrupted")
