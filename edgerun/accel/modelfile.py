"""The device "model" byte layout the seed decoded from the device's files (Section 3.3), written directly from data.

    120-byte header: magic, format version, ..., last 4 bytes = size of the data section (uint32)
    data section:    int8 values, row-major, zero-padded to whole 128x128 tiles
    metadata:        rows, cols (the raw shape), padded rows, padded cols (uint32), scaling factor f (float32)

All little-endian; an int8 value is the raw value times f. This is our own instance of that layout (the real
one is a closed format); it exists so that building a model from data can be timed against going through a
framework's export path, as the seed does (1.8 ms against 2.7 s for 2K x 2K).
"""

from __future__ import annotations

import struct

import numpy as np

from edgerun.accel.quant import check_finite
from edgerun.errors import EdgerunError

MAGIC = b"EDGERUN-NPU-MODEL\x00"
VERSION = 1
HEADER_BYTES = 120
TILE = 128
_META = struct.Struct("<IIIIf")


def write_model(x: np.ndarray) -> bytes:
    """Quantize a float matrix to int8 (f = 127 / max|x|) and serialise it as a device model."""
    if x.ndim != 2:
        raise EdgerunError(f"a model is a 2-D matrix, got shape {x.shape}")
    check_finite("model", x)
    maxabs = float(np.abs(x).max(initial=0.0))
    f = 127.0 / maxabs if maxabs > 0 else 1.0
    rows, cols = x.shape
    prow, pcol = -(-rows // TILE) * TILE, -(-cols // TILE) * TILE
    data = np.zeros((prow, pcol), dtype=np.int8)
    np.rint(x * f, out=data[:rows, :cols], casting="unsafe")
    header = bytearray(HEADER_BYTES)
    header[: len(MAGIC)] = MAGIC
    struct.pack_into("<I", header, len(MAGIC), VERSION)
    struct.pack_into("<I", header, HEADER_BYTES - 4, data.nbytes)
    return bytes(header) + data.tobytes() + _META.pack(rows, cols, prow, pcol, f)


def read_model(blob: bytes) -> tuple[np.ndarray, float]:
    """The int8 matrix (raw shape) and its scaling factor f from a model written by write_model."""
    if len(blob) < HEADER_BYTES + _META.size or not blob.startswith(MAGIC):
        raise EdgerunError("not a device model (bad header)")
    (version,) = struct.unpack_from("<I", blob, len(MAGIC))
    (size,) = struct.unpack_from("<I", blob, HEADER_BYTES - 4)
    if version != VERSION or len(blob) != HEADER_BYTES + size + _META.size:
        raise EdgerunError("device model is truncated or of another version")
    rows, cols, prow, pcol, f = _META.unpack_from(blob, HEADER_BYTES + size)
    if prow * pcol != size or rows > prow or cols > pcol:
        raise EdgerunError("device model metadata does not match its data section")
    data = np.frombuffer(blob, dtype=np.int8, count=size, offset=HEADER_BYTES).reshape(prow, pcol)
    return data[:rows, :cols].copy(), float(f)
