"""Read a .safetensors file into numpy arrays (bfloat16 widened to float32, which numpy lacks).

The format is an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets}},
then the raw bytes. Reading it directly keeps torch out of the runtime.
"""

from __future__ import annotations

import json
import struct

import numpy as np

from edgerun.errors import EdgerunError

_DTYPES = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I64": np.int64, "I32": np.int32,
           "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    with open(path, "rb") as f:
        data = f.read()
    try:
        (size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + size])
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise EdgerunError(f"{path!r} is not a safetensors file: {exc}") from None
    base = 8 + size
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, stop = (int(v) for v in info["data_offsets"])
        if base + stop > len(data):
            raise EdgerunError(f"{path!r} is truncated: {name} ends past the file")
        raw = np.frombuffer(data, np.uint8, stop - start, base + start)
        dtype = info["dtype"]
        if dtype == "BF16":
            arr = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dtype in _DTYPES:
            arr = raw.view(_DTYPES[dtype])
        else:
            raise EdgerunError(f"{path!r}: {name} has dtype {dtype}, which is not supported")
        out[name] = arr.reshape(info["shape"])
    return out
