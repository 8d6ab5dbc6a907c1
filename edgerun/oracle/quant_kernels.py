"""Exact numpy kernels for the quantized ops (edgerun/ir/ops/quant_ops.py): the executable spec of int8/int4.

Exactness is the point, so every choice is pinned here:
- Integer products accumulate exactly. Operands are first shifted by their zero points into [-255, 255], so
  each product is below 2^16 and a sum of K of them below 2^16 * K. The kernels multiply in float64 (BLAS
  speed), which is exact while every partial sum is an integer below 2^53: true for K < 2^37, checked, and
  an int64 numpy product is used beyond. The int32 result wraps like the two's complement hardware does.
- Rounding is half to even (np.rint) and results saturate to the target range, as ONNX QuantizeLinear says.
  Quantize divides in float32 (x / scale, the spec's formula, and what ONNX Runtime does).
- Requantization (int32 accumulator times a float32 scale) is done in fixed point with no rounding at all
  before the final one: the scale's 24-bit mantissa times a 31-bit accumulator fits int64, and the shift
  right rounds half to even. ONNX Runtime converts the accumulator to float32 first (rounding above 2^24)
  and multiplies in float32, so it can differ from this exact result by one step; see docs/quantization.md.
  `requantize(arithmetic="float32")` is that float32 epilogue, spelled out (the int8-static flow emits it,
  so the ONNX Runtime delegate can run its layers as QLinearConv bit-exactly).
- Int4 weights dequantize in float32 exactly as ONNX Runtime's MatMulNBits: (q - zero_point) * scale.
  With `activations="int8"` the input is rounded first, per row and group of K, to int8 codes with scale
  max|a| / 127 (the reciprocal multiplied, rounding half to even: MLAS's int8 path, llama.cpp's Q8); each
  group's integer dot product is exact, scaled by both scales in float32, and the groups summed in float32.

Each kernel has the reference signature kernel(inputs, attrs, outputs) -> None and writes into outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from edgerun.errors import EdgerunError
from edgerun.ir.ops.atomic import conv_geometry

Kernel = Callable[[list[np.ndarray], dict[str, Any], list[np.ndarray]], None]
QUANT_KERNELS: dict[str, Kernel] = {}

_FLOAT64_EXACT_K = 2 ** 37  # K * 2^16 < 2^53: every partial sum of shifted 8-bit products is exact in float64
_INT4_CHUNK = 256  # elements of K dequantized per step of matmul_int4's inner loop


def _kernel(name: str) -> Callable[[Kernel], Kernel]:
    def deco(fn: Kernel) -> Kernel:
        QUANT_KERNELS[name] = fn
        return fn
    return deco


def _range(dtype: np.dtype) -> tuple[int, int]:
    info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def quantize_values(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """saturate(round_half_even(x / scale) + zero_point) in the zero point's dtype (NaN -> zero point)."""
    with np.errstate(all="ignore"):
        r = np.rint(np.true_divide(x.astype(np.float32), scale.astype(np.float32), dtype=np.float32))
    r = np.nan_to_num(r.astype(np.float64), nan=0.0, posinf=1e10, neginf=-1e10) + zero_point.astype(np.float64)
    lo, hi = _range(zero_point.dtype)
    return np.clip(r, lo, hi).astype(zero_point.dtype)


@_kernel("quantize_linear")
def _quantize_linear(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    x, scale, zp = ins
    outs[0][...] = quantize_values(x, scale, zp)


@_kernel("dequantize_linear")
def _dequantize_linear(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    q, scale, zp = ins
    shifted = q.astype(np.int64) - zp.astype(np.int64)
    # float32 (q - zp) * scale, one rounding, as the spec; the int64 difference is exact even for int32 data.
    outs[0][...] = shifted.astype(np.float32) * scale.astype(np.float32)


def _round_shift_half_even(v: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """round_half_even(v / 2^shift) for int64 v and shift >= 1, exactly."""
    s = np.minimum(shift, 62)  # |v| < 2^55, so any larger shift rounds to 0 just the same
    q = np.right_shift(v, s)  # floor for signed int64
    r = v - np.left_shift(q, s)
    half = np.left_shift(np.int64(1), s - 1)
    return q + ((r > half) | ((r == half) & ((q & 1) == 1)))


def requantize_values(acc: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """saturate(round_half_even(acc * scale) + zero_point) computed exactly in int64 fixed point."""
    scale = np.asarray(scale, dtype=np.float32)
    if not np.all(np.isfinite(scale)):
        raise EdgerunError("requantize scale must be finite")
    mant, exp = np.frexp(scale.astype(np.float64))  # scale = mant * 2^exp, |mant| in [0.5, 1)
    m = (mant * 2.0 ** 24).astype(np.int64)  # exact: a float32 mantissa has 24 bits
    shift = (24 - exp).astype(np.int64)  # acc * scale = acc * m / 2^shift
    v = acc.astype(np.int64) * m  # |v| < 2^31 * 2^24 = 2^55
    right = _round_shift_half_even(v, np.maximum(shift, 1))
    # shift <= 0 means scale >= 2^23: anything nonzero saturates, so clip before shifting left.
    left = np.left_shift(np.clip(v, -(2 ** 40), 2 ** 40), np.clip(-shift, 0, 20))
    value = np.where(shift >= 1, right, left) + zero_point.astype(np.int64)
    lo, hi = _range(zero_point.dtype)
    return np.clip(value, lo, hi).astype(zero_point.dtype)


def requantize_float32(acc: np.ndarray, scale: np.ndarray, zero_point: np.ndarray) -> np.ndarray:
    """saturate(round_half_even(float32(float32(acc) * scale)) + zero_point): ONNX Runtime's (MLAS's)
    requantization, one IEEE rounding per step, so numpy's float32 reproduces it bit for bit."""
    with np.errstate(all="ignore"):
        v = np.rint(np.multiply(acc.astype(np.float32), np.asarray(scale, np.float32), dtype=np.float32))
    lo, hi = _range(zero_point.dtype)
    # Saturate before adding the zero point (as MLAS does), in float64 so no value wraps on the way.
    v = np.clip(v.astype(np.float64), lo - zero_point.astype(np.float64), hi - zero_point.astype(np.float64))
    return (v + zero_point.astype(np.float64)).astype(zero_point.dtype)


@_kernel("requantize")
def _requantize(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    acc, scale, zp = ins
    if attrs.get("arithmetic", "exact") == "float32":
        outs[0][...] = requantize_float32(acc, scale, zp)
    else:
        outs[0][...] = requantize_values(acc, scale, zp)


def _exact_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Integer matmul of shifted 8-bit operands (held as float64 or int64), exact, as int64."""
    if a.shape[-1] < _FLOAT64_EXACT_K:
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.int64)
    return np.matmul(a.astype(np.int64), b.astype(np.int64))


@_kernel("matmul_integer")
def _matmul_integer(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    a, b, a_zp, b_zp = ins
    sa = a.astype(np.int32) - a_zp.astype(np.int32)
    sb = b.astype(np.int32) - b_zp.astype(np.int32)
    outs[0][...] = _exact_matmul(sa, sb).astype(np.int32)  # wraps on overflow, as int32 hardware does


@_kernel("conv_integer")
def _conv_integer(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    x, w, x_zp, w_zp = ins
    stride, (top, left, bottom, right), dil, groups = conv_geometry(attrs)
    # Shifting before padding makes the padding a real zero (ONNX Runtime pads with x_zp: the same thing).
    xs = np.pad(x.astype(np.float64) - float(x_zp.reshape(-1)[0]), ((0, 0), (0, 0), (top, bottom), (left, right)))
    ws = w.astype(np.float64) - w_zp.astype(np.float64)
    out = outs[0]
    n, oc, oh, ow = out.shape
    _, cin_g, kh, kw = w.shape
    if cin_g * kh * kw >= _FLOAT64_EXACT_K:
        raise EdgerunError(f"conv_integer window of {cin_g * kh * kw} products is too large for exact sums")
    sn, sc, sh, sw = xs.strides
    win = as_strided(xs, (n, x.shape[1], oh, ow, kh, kw),
                     (sn, sc, sh * stride[0], sw * stride[1], sh * dil[0], sw * dil[1]), writeable=False)
    oc_g = oc // groups
    for g in range(groups):
        cols = win[:, g * cin_g:(g + 1) * cin_g].transpose(0, 2, 3, 1, 4, 5).reshape(n, oh * ow, -1)
        wg = ws[g * oc_g:(g + 1) * oc_g].reshape(oc_g, -1)
        res = np.matmul(cols, wg.T).astype(np.int64)  # N, OH*OW, OCg: exact integers (see module doc)
        out[:, g * oc_g:(g + 1) * oc_g] = res.transpose(0, 2, 1).reshape(n, oc_g, oh, ow).astype(np.int32)


def dynamic_qparams(x: np.ndarray, dtype: np.dtype, per_token: bool) -> tuple[np.ndarray, np.ndarray]:
    """(scale, zero point) of ONNX DynamicQuantizeLinear, generalised to int8 and to rows of the last axis.

    The range always includes 0 (so 0 is exact); an all-zero range gets scale 1, as ONNX Runtime does.
    """
    lo, hi = _range(dtype)
    axis = -1 if per_token else None
    x = x.astype(np.float32)
    x_min = np.minimum(np.min(x, axis=axis, keepdims=per_token), np.float32(0))
    x_max = np.maximum(np.max(x, axis=axis, keepdims=per_token), np.float32(0))
    span = (x_max - x_min).astype(np.float32)
    scale = np.where(span == 0, np.float32(1), span / np.float32(hi - lo)).astype(np.float32)
    initial = np.float32(lo) - x_min / scale
    zp = np.rint(np.clip(initial, lo, hi)).astype(dtype)
    return np.asarray(scale, np.float32), np.asarray(zp)


@_kernel("dynamic_quantize")
def _dynamic_quantize(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    x = ins[0]
    if not np.all(np.isfinite(x)):
        raise EdgerunError("dynamic_quantize input has NaN or infinity; its range has no int8 scale")
    scale, zp = dynamic_qparams(x, outs[0].dtype, bool(attrs.get("per_token")))
    outs[0][...] = quantize_values(x, scale, zp)
    outs[1][...] = scale
    outs[2][...] = zp


def unpack_int4(packed: np.ndarray) -> np.ndarray:
    """uint8 [..., B] holding two 4-bit values per byte (low nibble first) -> uint8 [..., 2B] in 0..15."""
    out = np.empty((*packed.shape[:-1], packed.shape[-1] * 2), dtype=np.uint8)
    out[..., 0::2] = packed & 0x0F
    out[..., 1::2] = packed >> 4
    return out


def pack_int4(values: np.ndarray) -> np.ndarray:
    """uint8 [..., 2B] in 0..15 -> [..., B], two per byte, low nibble first (ONNX Runtime's MatMulNBits)."""
    v = values.astype(np.uint8)
    return (v[..., 0::2] | (v[..., 1::2] << 4)).astype(np.uint8)


def quantize_int8_groups(a: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of `a` [R, K] as int8 codes (held in float32) [R, G, group] and scales [R, G], K zero-padded."""
    rows, k = a.shape
    blocks = -(-k // group)
    padded = np.zeros((rows, blocks * group), np.float32)
    padded[:, :k] = a
    g = padded.reshape(rows, blocks, group)
    scale = (np.abs(g).max(axis=2) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inverse = np.where(scale > 0, np.float32(1) / scale, np.float32(0)).astype(np.float32)
    codes = np.clip(np.rint(g * inverse[:, :, None]), -127, 127).astype(np.float32)
    return codes, scale


def _matmul_int4_int8_activations(a: np.ndarray, packed: np.ndarray, scales: np.ndarray, zero: np.ndarray,
                                  out: np.ndarray) -> None:
    n, blocks, half = packed.shape
    group = 2 * half
    rows = a.reshape(-1, a.shape[-1]).astype(np.float32)
    codes, a_scale = quantize_int8_groups(rows, group)  # [R, G, group], [R, G]
    weights = unpack_int4(packed).astype(np.float32) - zero  # [N, G, group], integers in -15..15
    # Per group, 127 * 15 * 256 < 2^24: the float32 dot products are exact integers.
    lhs = codes.transpose(1, 0, 2)  # [G, R, group]
    acc = np.zeros((rows.shape[0], n), np.float32)
    step = max(1, (1 << 22) // max(1, blocks * rows.shape[0]))  # output columns per chunk: bounded memory
    for c0 in range(0, n, step):
        c1 = min(n, c0 + step)
        dots = np.matmul(lhs, weights[c0:c1].transpose(1, 2, 0))  # [G, R, cols]
        dots *= a_scale.T[:, :, None] * scales[c0:c1].T[:, None, :]
        acc[:, c0:c1] = dots.sum(axis=0, dtype=np.float32)
    out[...] = acc.reshape(out.shape)


@_kernel("matmul_int4")
def _matmul_int4(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    a, packed, scales = ins[:3]
    zp = ins[3] if len(ins) > 3 else None
    k, group = int(attrs["k"]), int(attrs["group_size"])
    if attrs.get("activations", "float") == "int8":
        n, blocks, _ = packed.shape
        zero = (zp.astype(np.float32) if zp is not None else np.full((n, blocks), 8, np.float32))[:, :, None]
        _matmul_int4_int8_activations(a, packed, scales.astype(np.float32), zero, outs[0])
        return
    n, blocks, _ = packed.shape
    zero = (zp.astype(np.float32) if zp is not None else np.full((n, blocks), 8, np.float32))[:, :, None]
    scale = scales.astype(np.float32)[:, :, None]
    acc = np.zeros(outs[0].shape, dtype=np.float32)
    step = max(1, _INT4_CHUNK // group)  # groups per step: the float weight never exists whole
    for b0 in range(0, blocks, step):
        b1 = min(blocks, b0 + step)
        q = unpack_int4(packed[:, b0:b1]).astype(np.float32)
        w = ((q - zero[:, b0:b1]) * scale[:, b0:b1]).reshape(n, -1)  # [N, chunk of K]
        k0, k1 = b0 * group, min(k, b1 * group)
        acc += np.matmul(a[..., k0:k1], w[:, :k1 - k0].T)
    outs[0][...] = acc
