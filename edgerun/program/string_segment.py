"""The bytes of a string constant's segment: each element, in row-major order, as a u32 little-endian byte
count followed by that many bytes of UTF-8. No padding between elements, no terminator: the segment's
`nbytes` is exactly the sum, and the reader checks that the elements fill it, no more and no less.

A string segment is the one kind whose length is not shape x itemsize. Its dtype, "string", is unknown to a
reader from before strings, which refuses the file at that dtype ("unknown dtype 'string'") before reading
any bytes, as it refuses every dtype added since 1.1.
"""

from __future__ import annotations

import struct

import numpy as np

from edgerun.errors import EdgerunError, ProgramFormatError
from edgerun.ir.dtypes import string_array

_LENGTH = struct.Struct("<I")


def encode_strings(value: np.ndarray, what: str) -> np.ndarray:
    """The segment's bytes (uint8) for a string tensor; ProgramFormatError naming `what` for a non-str element."""
    try:
        strings = string_array(value, what)
    except EdgerunError as exc:
        raise ProgramFormatError(str(exc)) from None
    parts = []
    for s in strings.reshape(-1).tolist():
        raw = s.encode("utf-8")
        parts += [_LENGTH.pack(len(raw)), raw]
    return np.frombuffer(b"".join(parts), np.uint8)


def decode_strings(region: memoryview, offset: int, nbytes: int, shape: tuple[int, ...], what: str) -> np.ndarray:
    """The string tensor of `shape` held in region[offset : offset + nbytes]; ProgramFormatError when the
    elements do not fill the segment exactly or are not UTF-8."""
    count = 1
    for d in shape:
        count *= d
    if count * _LENGTH.size > nbytes:  # before allocating: every element takes its 4-byte length at least
        raise ProgramFormatError(f"{what}: {count} strings need at least {count * _LENGTH.size} bytes, the segment "
                                 f"has {nbytes}")
    data = bytes(region[offset:offset + nbytes])
    out = np.empty(count, dtype=object)
    position = 0
    for i in range(count):
        if position + _LENGTH.size > nbytes:
            raise ProgramFormatError(f"{what}: string {i} starts past the segment's end")
        (length,) = _LENGTH.unpack_from(data, position)
        position += _LENGTH.size
        if position + length > nbytes:
            raise ProgramFormatError(f"{what}: string {i} of {length} bytes runs past the segment's end")
        try:
            out[i] = data[position:position + length].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProgramFormatError(f"{what}: string {i} is not UTF-8 ({exc.reason})") from None
        position += length
    if position != nbytes:
        raise ProgramFormatError(f"{what}: {nbytes - position} bytes after the last string")
    return out.reshape(shape)
