"""GridSample (any number of spatial dims): per-tap weights and flat indices, one gather per tap.

Mirrors the spec's reference step by step: denormalise the grid (align_corners), round for nearest, move
out-of-border coordinates (border: clamp, reflection: reflect), then take 1 (nearest), 2 (linear) or 4
(cubic, a = -0.75) taps per axis; a tap outside the image reads 0, the clamped or the reflected pixel.
The N-D result is the tensor product of the per-axis taps, as the reference's recursion computes it.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType


def _reflect(ctx: ImportContext, v: str, lo: float, hi: float) -> str:
    """Reflect v into [lo, hi] by the nearer border, as many times as it takes."""
    def s(x: float) -> str:
        return ctx.scalar(x, v)
    span = hi - lo
    if span <= 0:
        return ctx.emit("expand", [s(lo)], shape=list(ctx.b.shape(v)))

    def fold(dx: str, near: float, far: float, sign: float) -> str:
        n = ctx.emit("floor", [ctx.emit("div", [dx, s(span)])])
        r = ctx.emit("sub", [dx, ctx.emit("mul", [n, s(span)])])
        even = ctx.emit("eq", [ctx.emit("mod", [n, s(2.0)], fmod=True), s(0.0)])
        return ctx.emit("where", [even, ctx.emit("add", [s(near), ctx.emit("mul", [r, s(sign)])]),
                                  ctx.emit("sub", [s(far), ctx.emit("mul", [r, s(sign)])])])
    below = fold(ctx.emit("sub", [s(lo), v]), lo, hi, 1.0)
    above = fold(ctx.emit("sub", [v, s(hi)]), hi, lo, -1.0)
    return ctx.emit("where", [ctx.emit("lt", [v, s(lo)]), below,
                              ctx.emit("where", [ctx.emit("gt", [v, s(hi)]), above, v])])


def _cubic(ctx: ImportContext, t: str) -> list[str]:
    a = -0.75

    def s(x: float) -> str:
        return ctx.scalar(x, t)

    def poly(x: str, coefs: tuple[float, ...]) -> str:
        acc = s(coefs[0])
        for c in coefs[1:]:
            acc = ctx.emit("add", [ctx.emit("mul", [acc, x]), s(c)])
        return acc
    t = ctx.emit("abs", [t])
    one_plus, one_minus = ctx.emit("add", [t, s(1.0)]), ctx.emit("sub", [s(1.0), t])
    two_minus = ctx.emit("sub", [s(2.0), t])
    outer = (a, -5 * a, 8 * a, -4 * a)
    inner = (a + 2, -(a + 3), 0.0, 1.0)
    return [poly(one_plus, outer), poly(t, inner), poly(one_minus, inner), poly(two_minus, outer)]


@onnx_op("GridSample")
def grid_sample(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x, grid = ctx.input(node, 0), ctx.input(node, 1)
    xs, gs = ctx.b.shape(x), ctx.b.shape(grid)
    dtype = ctx.b.dtype(x)
    if not dtype.is_float:
        raise node.refuse(f"GridSample of {dtype.value}")
    work = DType.float64 if dtype is DType.float64 else DType.float32  # float16 is computed in float32
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(node.attr("mode", "linear"), node.attr("mode", "linear"))
    padding = node.attr("padding_mode", "zeros")
    align = bool(node.attr("align_corners", 0))
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise node.refuse(f"mode {mode!r} with padding_mode {padding!r}")
    n, c, dims = xs[0], xs[1], list(xs[2:])
    nd, out = len(dims), list(gs[1:-1])
    g = ctx.cast(grid, work)
    axis_taps: list[list[tuple[str, str, str]]] = []  # per dim: (index int64, weight, in-range mask)
    for i, d in enumerate(dims):
        comp = ctx.emit("reshape", [ctx.emit("slice", [g], starts=[nd - 1 - i], ends=[nd - i], axes=[nd + 1])],
                        shape=[n, *out])

        def s(v: float, like: str = comp) -> str:
            return ctx.scalar(v, like)
        one = s(1.0)
        v = ctx.emit("mul", [ctx.emit("add", [comp, one]), s(0.5 * (d - 1))]) if align else \
            ctx.emit("mul", [ctx.emit("sub", [ctx.emit("mul", [ctx.emit("add", [comp, one]), s(float(d))]), one]),
                             s(0.5)])
        if mode == "nearest":
            v = ctx.emit("round", [v])
        lo, hi = (0.0, d - 1.0) if align else (-0.5, d - 0.5)
        outside = ctx.emit("logical_or", [ctx.emit("lt", [v, s(lo)]), ctx.emit("gt", [v, s(hi)])])
        if padding == "border":
            v = ctx.emit("where", [outside, ctx.emit("clamp", [v], min=0.0, max=d - 1.0), v])
        elif padding == "reflection":
            v = _reflect(ctx, v, lo, hi)
        if mode == "nearest":
            starts, weights = [ctx.emit("cast", [v], dtype="int64")], [ctx.emit("expand", [one], shape=[n, *out])]
        else:
            base = ctx.emit("floor", [v])
            frac = ctx.emit("sub", [v, base])
            first = ctx.emit("cast", [base], dtype="int64")
            if mode == "linear":
                offsets, weights = [0, 1], [ctx.emit("sub", [one, frac]), frac]
            else:
                offsets, weights = [-1, 0, 1, 2], _cubic(ctx, frac)
            starts = [ctx.emit("add", [first, ctx.b.const(np.int64(o))]) for o in offsets]
        taps = []
        for idx, w in zip(starts, weights):
            inside = ctx.emit("logical_and", [ctx.emit("ge", [idx, ctx.b.const(np.int64(0))]),
                                              ctx.emit("lt", [idx, ctx.b.const(np.int64(d))])])
            if padding == "reflection":
                idx = ctx.emit("cast", [_reflect(ctx, ctx.cast(idx, work), lo, hi)], dtype="int64")
            idx = ctx.emit("clamp", [idx], min=0, max=d - 1)
            taps.append((idx, w, inside))
        axis_taps.append(taps)
    # Rows of the data as [N * prod(dims), C]; each tap gathers one row per output position.
    size = math.prod(dims)
    rows = ctx.emit("reshape", [ctx.emit("transpose", [ctx.cast(x, work)],
                                         perm=[0, *range(2, nd + 2), 1])], shape=[n * size, c])
    batch = ctx.b.const((np.arange(n, dtype=np.int64) * size).reshape([n] + [1] * len(out)))
    strides = [math.prod(dims[i + 1:]) for i in range(nd)]
    total = ""
    for combo in itertools.product(*axis_taps):
        lin, weight, mask = batch, "", ""
        for (idx, w, inside), stride in zip(combo, strides):
            lin = ctx.emit("add", [lin, ctx.emit("mul", [idx, ctx.b.const(np.int64(stride))])])
            weight = ctx.emit("mul", [weight, w]) if weight else w
            mask = ctx.emit("logical_and", [mask, inside]) if mask else inside
        if padding == "zeros":
            weight = ctx.emit("where", [mask, weight, ctx.scalar(0.0, weight)])
        picked = ctx.emit("gather", [rows, lin], axis=0)  # [N, *out, C]
        term = ctx.emit("mul", [picked, ctx.emit("reshape", [weight], shape=[n, *out, 1])])
        total = ctx.emit("add", [total, term]) if total else term
    y = ctx.emit("transpose", [total], perm=[0, len(out) + 1, *range(1, len(out) + 1)])
    return [ctx.cast(y, dtype)]
