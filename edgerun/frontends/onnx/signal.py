"""DFT as two real matmuls with constant cosine and sine matrices (exact in structure, O(n^2) work).

The last axis holds [real] or [real, imaginary]; the transform runs along `axis`. dft_length truncates or
zero-pads the signal. Inverse transforms are refused (see the comment in dft()).
"""

from __future__ import annotations

import math

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op


def _along(ctx: ImportContext, x: str, axis: int, mat: np.ndarray) -> str:
    """x @ mat along `axis` of x."""
    shape = ctx.b.shape(x)
    perm = [d for d in range(len(shape)) if d != axis] + [axis]
    xt = ctx.emit("transpose", [x], perm=perm)
    flat = ctx.emit("reshape", [xt], shape=[math.prod(shape) // max(shape[axis], 1), shape[axis]])
    y = ctx.emit("matmul", [flat, ctx.b.const(mat, ctx.b.dtype(x))])
    y = ctx.emit("reshape", [y], shape=[shape[d] for d in perm[:-1]] + [mat.shape[1]])
    return ctx.emit("transpose", [y], perm=[perm.index(d) for d in range(len(shape))])


@onnx_op("DFT")
def dft(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    shape = ctx.b.shape(x)
    rank = len(shape)
    if node.version >= 20:
        axis_arr = ctx.static(node, 2, "axis")
        axis = int(axis_arr.reshape(-1)[0]) if axis_arr is not None else -2
    else:
        axis = int(node.attr("axis", 1))
    axis %= rank
    if axis == rank - 1:
        raise ValueError("DFT axis cannot be the complex (last) axis")
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    if inverse:
        # The float32 matmul form is off by ~n*eps*max|x| absolutely; inverse transforms typically return
        # signals with exact zeros, where that misses ONNX's atol of 1e-7. Refused rather than inexact.
        raise node.refuse("inverse DFT (float32 matmul DFT is not accurate enough near zero)")
    length_arr = ctx.static(node, 1, "dft_length")
    n_in = shape[axis]
    length = int(length_arr.reshape(-1)[0]) if length_arr is not None and length_arr.size else n_in
    used = min(n_in, length)
    if used < n_in:
        x = ctx.emit("slice", [x], starts=[0], ends=[used], axes=[axis])
    bins = length // 2 + 1 if onesided else length
    theta = 2 * np.pi * np.outer(np.arange(used), np.arange(bins)) / length
    cos, sin = np.cos(theta), np.sin(theta)
    sign = -1.0
    re = ctx.emit("slice", [x], starts=[0], ends=[1], axes=[rank - 1])
    out_re = _along(ctx, re, axis, cos)
    out_im = _along(ctx, re, axis, sign * sin)
    if shape[-1] == 2:
        im = ctx.emit("slice", [x], starts=[1], ends=[2], axes=[rank - 1])
        out_re = ctx.emit("sub", [out_re, _along(ctx, im, axis, sign * sin)])
        out_im = ctx.emit("add", [out_im, _along(ctx, im, axis, cos)])
    return [ctx.emit("concat", [out_re, out_im], axis=rank - 1)]
