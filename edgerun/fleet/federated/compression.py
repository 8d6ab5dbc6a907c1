"""Update compression for the upload: int8 (one symmetric scale per tensor) or top-k (the largest k
entries of each tensor by magnitude, as indices and values). An update is packed into flat arrays that
np.savez writes, and unpacked on the server against the global weights' shapes before validation.

int8 cuts an update to a quarter of its float32 size with an error of at most scale / 2 per entry; top-k
keeps a fraction of the entries. Their accuracy cost on the digits federation is measured by
`bench/federated.py --compression` (docs/federated.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from edgerun.fleet.errors import FleetError

SCHEMES = ("none", "int8", "topk")


def pack_update(delta: Mapping[str, np.ndarray], scheme: str = "none", fraction: float = 0.1) -> dict[str, np.ndarray]:
    """Flat arrays for one update: "<name>" (none), "<name>.q" and "<name>.scale" (int8), "<name>.idx" and
    "<name>.val" (topk: the `fraction` of each tensor's entries largest in magnitude, at least one)."""
    if scheme not in SCHEMES:
        raise FleetError(f"unknown update compression {scheme!r}; known: {', '.join(SCHEMES)}")
    out: dict[str, np.ndarray] = {}
    for name, array in delta.items():
        a = np.asarray(array, np.float32)
        if scheme == "none":
            out[name] = a
        elif scheme == "int8":
            peak = float(np.max(np.abs(a))) if a.size else 0.0
            scale = peak / 127.0 if peak > 0 else 1.0
            out[f"{name}.q"] = np.clip(np.rint(a / scale), -127, 127).astype(np.int8)
            out[f"{name}.scale"] = np.asarray(scale, np.float32)
        else:
            if not 0 < fraction <= 1:
                raise FleetError(f"top-k needs 0 < fraction <= 1, got {fraction}")
            flat = a.reshape(-1)
            k = max(1, math.ceil(fraction * flat.size))
            idx = np.argpartition(np.abs(flat), flat.size - k)[flat.size - k:].astype(
                np.int32 if flat.size < 2**31 else np.int64)
            out[f"{name}.idx"] = np.sort(idx)
            out[f"{name}.val"] = flat[np.sort(idx)]
    return out


def unpack_update(arrays: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The update as float32 arrays shaped like `reference`, from `pack_update`'s arrays (any scheme).
    A malformed packing (a missing piece, an index out of range) is a FleetError; the shapes and values of
    a well-formed one are checked afterwards by validate_update."""
    out = {}
    for name, ref in reference.items():
        shape = np.shape(ref)
        try:
            if name in arrays:
                out[name] = np.asarray(arrays[name], np.float32)
            elif f"{name}.q" in arrays:
                q = np.asarray(arrays[f"{name}.q"])
                if q.dtype != np.int8:
                    raise FleetError(f"{name}.q must be int8, got {q.dtype}")
                out[name] = (q.astype(np.float32) * np.float32(arrays[f"{name}.scale"])).reshape(q.shape)
            elif f"{name}.idx" in arrays:
                flat = np.zeros(int(np.prod(shape)), np.float32)
                idx = np.asarray(arrays[f"{name}.idx"], np.int64)
                if idx.size and (idx.min() < 0 or idx.max() >= flat.size):
                    raise FleetError(f"{name}.idx holds an index outside the weight's {flat.size} entries")
                flat[idx] = np.asarray(arrays[f"{name}.val"], np.float32)
                out[name] = flat.reshape(shape)
        except (KeyError, ValueError, TypeError) as error:
            raise FleetError(f"malformed update for weight {name!r}: {error}") from None
    return out
