"""tpuGemm, the library GEMM: `gemm(a, b, devices=1)` for float arrays, float64 out."""

from __future__ import annotations

import numpy as np

from edgerun.accel.quant import SLICED
from edgerun.accel.runtime import DEFAULT_BITS, Runtime
from edgerun.errors import EdgerunError


def gemm(a: np.ndarray, b: np.ndarray, devices: int = 1, *, method: str = "conv2D", bits: int = DEFAULT_BITS,
         flags: str = SLICED) -> np.ndarray:
    """A @ B on `devices` emulated npus: strided conv2D (default) or FullyConnected, bit-sliced so that small
    integers are exact and wider data keeps `bits` significant bits per operand."""
    a_arr, b_arr = np.asarray(a), np.asarray(b)
    for name, x in (("a", a_arr), ("b", b_arr)):
        if x.dtype.kind not in "biuf":
            raise EdgerunError(f"gemm: {name} must be a real numeric array, got dtype {x.dtype}")
    with Runtime(devices, bits=bits) as rt:
        return rt.gemm(a_arr.astype(np.float64), b_arr.astype(np.float64), method=method, flags=flags)
