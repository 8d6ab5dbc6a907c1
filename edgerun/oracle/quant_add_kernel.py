"""The reference kernel of `quantized_add` (edgerun/ir/ops/quant_add_ops.py): ONNX Runtime's x86 QLinearAdd,
bit for bit.

Each step is one IEEE float32 rounding, as in MLAS's AVX2 kernel. The two fused multiply-adds are the only
steps numpy has no float32 operation for; `fma32` computes them exactly: the product of two float32 values
is exact in float64 (24 + 24 bits), the sum is rounded to float64 with the "round to odd" rule (TwoSum gives
the rounding error; a nonzero error forces the last bit to 1), and rounding that to float32 is then the
correctly rounded fma (53 >= 24 + 2 bits, the condition under which round-to-odd composes).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from edgerun.oracle.quant_kernels import Kernel


def fma32(x: ArrayLike, y: ArrayLike, z: ArrayLike) -> np.ndarray:
    """float32(x * y + z) rounded once (half to even), for float32 operands broadcast together."""
    x64, y64, z64 = (np.asarray(v, np.float32).astype(np.float64) for v in (x, y, z))
    with np.errstate(all="ignore"):
        p = x64 * y64  # exact
        s = p + z64
        bp = s - z64
        err = (p - bp) + (z64 - (s - bp))  # TwoSum: s + err == p + z exactly
        inexact_even = (err != 0) & ((s.view(np.int64) & 1) == 0)
        s = np.where(inexact_even, np.nextafter(s, np.where(err > 0, np.inf, -np.inf)), s)
        return s.astype(np.float32)


def quantized_add_values(a: np.ndarray, a_scale: np.ndarray, a_zp: np.ndarray, b: np.ndarray, b_scale: np.ndarray,
                         b_zp: np.ndarray, y_scale: np.ndarray, y_zp: np.ndarray) -> np.ndarray:
    """ONNX Runtime's QLinearAdd (MLAS AVX2): see edgerun/ir/ops/quant_add_ops.py for the formula."""
    f32 = np.float32
    with np.errstate(all="ignore"):
        ra = f32(f32(np.asarray(a_scale).reshape(())) / f32(np.asarray(y_scale).reshape(())))
        rb = f32(f32(np.asarray(b_scale).reshape(())) / f32(np.asarray(y_scale).reshape(())))
        za, zb, zy = (f32(int(np.asarray(z).reshape(()))) for z in (a_zp, b_zp, y_zp))
        fixed = f32(zy - f32(f32(ra * za) + f32(rb * zb)))
        v = fma32(a.astype(np.float32), ra, fma32(b.astype(np.float32), rb, fixed))
    info = np.iinfo(np.asarray(y_zp).dtype)
    # cvtps2dq rounds half to even; a value past int32 becomes INT32_MIN there, which never happens for
    # 8-bit operands and scale ratios the delegate claims (edgerun/backends/onnxruntime/onnx_quant_ops.py).
    r = np.nan_to_num(np.rint(v.astype(np.float64)), nan=float(info.min))
    return np.clip(r, info.min, info.max).astype(np.asarray(y_zp).dtype)


def _quantized_add(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    outs[0][...] = quantized_add_values(*ins)


QUANT_ADD_KERNELS: dict[str, Kernel] = {"quantized_add": _quantized_add}
