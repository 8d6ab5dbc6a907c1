"""The wire format: ZeroMQ multipart messages of one JSON header frame and raw tensor frames. No pickle.

A request is `[header, tensor_0, tensor_1, ...]` where `header` is UTF-8 JSON:

    {"v": 1, "id": 7, "token": "...", "method": "call", "args": {...},
     "tensors": [{"dtype": "float32", "shape": [2, 3]}, ...]}

and each following frame holds one tensor's bytes, C-contiguous and little-endian, exactly
`prod(shape) * itemsize` long. A reply has the same shape with `{"v": 1, "id": 7, "ok": true, "result": {...},
"tensors": [...]}`, or `"ok": false, "error": {"type", "message", "traceback"}`. See docs/remote.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.dtypes import DType
from edgerun.json_limits import TooDeepError, loads_bounded

WIRE_VERSION = 1
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADER_DEPTH = 64  # JSON nesting of a header, checked before it is parsed
MAX_TENSORS_PER_MESSAGE = 256
MAX_RANK = 8


class WireError(EdgerunError):
    """A message that does not follow the wire format (the peer gets this text back)."""


@dataclass(frozen=True)
class Limits:
    """Bounds a server enforces; a client learns them from `hello` and checks before sending."""

    max_message_bytes: int = 1 << 30
    max_tensor_bytes: int = 1 << 30

    def to_json(self) -> dict[str, int]:
        return {"max_message_bytes": self.max_message_bytes, "max_tensor_bytes": self.max_tensor_bytes}


def tensor_header(arr: np.ndarray) -> dict[str, Any]:
    return {"dtype": DType.of(arr).value, "shape": list(arr.shape)}


def to_wire(arr: np.ndarray) -> np.ndarray:
    """The array as it travels: contiguous, little-endian, one of our dtypes."""
    arr = np.asarray(arr)
    if DType.of(arr) is DType.string:  # DType.of raises for dtypes the IR does not have
        raise ValueError("string tensors do not travel to a remote backend (only the reference runs string ops)")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    # Not np.ascontiguousarray: it turns a 0-d array into a 1-d one.
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def encode(header: dict[str, Any], tensors: list[np.ndarray]) -> list[Any]:
    """Frames for one message; tensor frames are the arrays' own buffers (zero-copy send)."""
    wire = [to_wire(t) for t in tensors]
    header = dict(header, v=WIRE_VERSION, tensors=[tensor_header(t) for t in wire])
    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > MAX_HEADER_BYTES:
        raise WireError(f"message header of {len(text)} bytes exceeds {MAX_HEADER_BYTES}")
    return [text, *(memoryview(t.reshape(-1).view(np.uint8)) for t in wire)]  # type: ignore[arg-type]


def decode_header(frame: bytes | memoryview) -> dict[str, Any]:
    if len(frame) > MAX_HEADER_BYTES:
        raise WireError(f"header frame of {len(frame)} bytes exceeds {MAX_HEADER_BYTES}")
    try:
        header = loads_bounded(bytes(frame).decode("utf-8"), MAX_HEADER_DEPTH)
    except TooDeepError as exc:  # json.loads would recurse once per bracket (RecursionError)
        raise WireError(f"header refused: {exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError(f"header is not UTF-8 JSON: {exc}") from None
    if not isinstance(header, dict):
        raise WireError("header must be a JSON object")
    if header.get("v") != WIRE_VERSION:
        raise WireError(f"wire version {header.get('v')!r} is not {WIRE_VERSION}")
    return header


def decode_tensors(header: dict[str, Any], frames: list[Any], limits: Limits) -> list[np.ndarray]:
    """Arrays for the tensor frames, validated against the header's declarations and the limits."""
    specs = header.get("tensors", [])
    if not isinstance(specs, list) or len(specs) > MAX_TENSORS_PER_MESSAGE:
        raise WireError("header 'tensors' must be a list of at most "
                        f"{MAX_TENSORS_PER_MESSAGE} tensor descriptions")
    if len(specs) != len(frames):
        raise WireError(f"header declares {len(specs)} tensors but {len(frames)} tensor frames came")
    out = []
    for i, (spec, frame) in enumerate(zip(specs, frames)):
        if not isinstance(spec, dict):
            raise WireError(f"tensor {i}: description must be an object")
        try:
            dtype = DType(str(spec.get("dtype")))
        except ValueError:
            raise WireError(f"tensor {i}: unknown dtype {spec.get('dtype')!r}") from None
        if dtype is DType.string:  # elements are Python objects, never bytes from a peer
            raise WireError(f"tensor {i}: string tensors do not travel on the wire")
        shape = spec.get("shape")
        if not isinstance(shape, list) or len(shape) > MAX_RANK or \
                not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 40 for d in shape):
            raise WireError(f"tensor {i}: shape must be a list of at most {MAX_RANK} non-negative integers")
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes > limits.max_tensor_bytes:
            raise WireError(f"tensor {i}: {nbytes} bytes exceeds the limit of {limits.max_tensor_bytes}")
        buf = memoryview(frame.buffer if hasattr(frame, "buffer") else frame)
        if buf.nbytes != nbytes:
            raise WireError(f"tensor {i}: declared {dtype.value}{shape} ({nbytes} bytes), frame has {buf.nbytes}")
        out.append(np.frombuffer(buf, dtype=dtype.np).reshape(shape))
    return out


def error_body(kind: str, message: str, tb: str = "") -> dict[str, Any]:
    return {"ok": False, "error": {"type": kind, "message": message, "traceback": tb}}
