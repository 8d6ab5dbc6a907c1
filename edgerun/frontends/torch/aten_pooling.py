"""Handlers for ATen pooling and resampling ops: max/avg/adaptive pooling, nearest and bilinear upsampling."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerun.frontends.torch.context import ConvertContext, handles, reads_beyond
from edgerun.ir.dtypes import DType

# ---- pooling -----------------------------------------------------------------------------------------

def _as_batched(ctx: ConvertContext, x: str) -> tuple[str, bool]:
    shape = ctx.b.shape(x)
    if len(shape) == 3:
        return ctx.b.emit("reshape", [x], shape=[1, *shape]), True
    if len(shape) != 4:
        ctx.unsupported("pooling needs a 3-D or 4-D input")
    return x, False


def _pads_of(padding: Any) -> list[int]:
    p = [int(v) for v in padding] if padding else [0, 0]
    if len(p) == 1:
        p = p * 2
    return [p[0], p[1], p[0], p[1]]


def _pair(v: Any, default: Any) -> list[int]:
    v = v if v else default
    v = [int(x) for x in (v if isinstance(v, list | tuple) else [v])]
    return v * 2 if len(v) == 1 else v


@handles("aten.max_pool2d_with_indices.default", "aten.max_pool2d.default")
def _max_pool(ctx: ConvertContext, node: Any) -> Any:
    a = ctx.bind(node)
    x, unbatched = _as_batched(ctx, ctx.v(a["self"]))
    kernel = _pair(a["kernel_size"], None)
    stride, pads, dilation = _pair(a["stride"], kernel), _pads_of(a["padding"]), _pair(a["dilation"], [1])
    y = ctx.b.emit("max_pool2d", [x], kernel=kernel, stride=stride, padding=pads, dilation=dilation,
                   ceil_mode=bool(a["ceil_mode"]))
    indices = None
    if "with_indices" in str(node.target) and reads_beyond(ctx, node, 1):
        indices = _max_pool_indices(ctx, x, ctx.b.shape(y), kernel, stride, pads, dilation)
    if unbatched:
        y = ctx.b.emit("reshape", [y], shape=list(ctx.b.shape(y)[1:]))
        if indices:
            indices = ctx.b.emit("reshape", [indices], shape=list(ctx.b.shape(indices)[1:]))
    return [y, indices] if "with_indices" in str(node.target) else y


def _max_pool_indices(ctx: ConvertContext, x: str, out_shape: tuple[int, ...], kernel: list[int],
                      stride: list[int], pads: list[int], dilation: list[int]) -> str:
    """torch's max-pool indices (flat h*W + w in the input plane, first maximum in window order).

    One raster gathers every window tap into [N*C, taps, OH, OW] from the -inf-padded input; argmax over
    the taps picks the tap; integer arithmetic turns (tap, output position) into the input's flat index.
    """
    b = ctx.b
    n, c, h, w = b.shape(x)
    oh, ow = out_shape[2:]
    kh, kw = kernel
    # Pad so every window lies inside, including ceil_mode's overhang at the bottom and right.
    bottom = max(pads[2], (oh - 1) * stride[0] + (kh - 1) * dilation[0] + 1 - h - pads[0])
    right = max(pads[3], (ow - 1) * stride[1] + (kw - 1) * dilation[1] + 1 - w - pads[1])
    padded = b.emit("pad", [x], pads=[[0, 0], [0, 0], [pads[0], bottom], [pads[1], right]], mode="constant",
                    value=float("-inf"))
    hp, wp = b.shape(padded)[2:]
    planes = b.emit("reshape", [padded], shape=[n * c, hp, wp])
    taps = kh * kw
    regions = []
    for i in range(kh):
        for j in range(kw):
            k = i * kw + j
            regions.append([0, i * dilation[0] * wp + j * dilation[1], hp * wp, stride[0] * wp, stride[1],
                            k * oh * ow, taps * oh * ow, ow, 1, n * c, oh, ow])
    windows = b.emit("raster", [planes], regions=regions, shape=[n * c, taps, oh, ow], fill=None)
    tap = b.emit("argmax", [windows], axis=1, keepdims=False)  # [N*C, OH, OW] int64
    tap_row = b.emit("div", [tap, b.scalar(kw, tap)], rounding="floor")
    tap_col = b.binary("sub", tap, b.binary("mul", tap_row, b.scalar(kw, tap)))
    row0 = np.arange(oh, dtype=np.int64)[:, None] * stride[0] - pads[0]
    col0 = np.arange(ow, dtype=np.int64)[None, :] * stride[1] - pads[1]
    row = b.binary("add", b.binary("mul", tap_row, b.scalar(dilation[0], tap)), b.const(row0))
    col = b.binary("add", b.binary("mul", tap_col, b.scalar(dilation[1], tap)), b.const(col0))
    flat = b.binary("add", b.binary("mul", row, b.scalar(w, row)), col)
    return b.emit("reshape", [flat], shape=[n, c, oh, ow])


@handles("aten.avg_pool2d.default")
def _avg_pool(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x, unbatched = _as_batched(ctx, ctx.v(a["self"]))
    kernel, stride, pads = _pair(a["kernel_size"], None), _pair(a["stride"], a["kernel_size"]), _pads_of(a["padding"])
    divisor = a["divisor_override"]
    y = ctx.b.emit("avg_pool2d", [x], kernel=kernel, stride=stride, padding=pads, ceil_mode=bool(a["ceil_mode"]),
                   count_include_pad=bool(a["count_include_pad"]) or divisor is not None)
    if ctx.b.shape(y)[2:] != ctx.out_shape(node)[-2:]:
        ctx.unsupported("avg_pool2d geometry whose output size differs from torch's")
    if divisor is not None:
        # Window sums are the padded-count means times that count; then divide by the override.
        h, w = ctx.b.shape(x)[2:]
        oh, ow = ctx.b.shape(y)[2:]
        rows = np.arange(oh) * stride[0] - pads[0]
        cols = np.arange(ow) * stride[1] - pads[1]
        cnt_r = np.minimum(rows + kernel[0], h + pads[2]) - np.maximum(rows, -pads[0])
        cnt_c = np.minimum(cols + kernel[1], w + pads[3]) - np.maximum(cols, -pads[1])
        scale = (cnt_r[:, None] * cnt_c[None, :]).astype(np.float64) / float(divisor)
        y = ctx.b.binary("mul", y, ctx.b.const(scale, ctx.b.dtype(y)))
    return ctx.b.emit("reshape", [y], shape=list(ctx.b.shape(y)[1:])) if unbatched else y


@handles("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def _adaptive_avg_pool(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x, unbatched = _as_batched(ctx, ctx.v(a["self"]))
    out_hw = ctx.out_shape(node)[-2:]
    if 0 in ctx.b.shape(x):
        ctx.unsupported("adaptive pooling of an empty tensor")
    y = ctx.b.emit("adaptive_avg_pool2d", [x], output_size=[int(d) for d in out_hw])
    return ctx.b.emit("reshape", [y], shape=list(ctx.b.shape(y)[1:])) if unbatched else y



# ---- resampling ------------------------------------------------------------------------------------

def _nearest_indices(in_size: int, out_size: int, scale: float | None) -> np.ndarray:
    # torch: src = min(floor(dst * scale), in - 1) with scale = 1/scale_factor when given, else in/out,
    # computed in float32.
    s = np.float32(1.0 / scale) if scale else np.float32(in_size) / np.float32(out_size)
    idx = np.floor(np.arange(out_size, dtype=np.float32) * s).astype(np.int64)
    return np.minimum(idx, in_size - 1)


@handles("aten.upsample_nearest2d.default", "aten.upsample_nearest2d.vec")
def _upsample_nearest(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["input"])
    in_h, in_w = ctx.b.shape(x)[-2:]
    out_h, out_w = ctx.out_shape(node)[-2:]
    scales = a.get("scale_factors") or [a.get("scales_h"), a.get("scales_w")]
    rows = _nearest_indices(in_h, out_h, scales[0] if scales else None)
    cols = _nearest_indices(in_w, out_w, scales[1] if scales else None)
    rank = len(ctx.b.shape(x))
    y = ctx.b.emit("gather", [x, ctx.b.const(rows)], axis=rank - 2)
    return ctx.b.emit("gather", [y, ctx.b.const(cols)], axis=rank - 1)


def _linear_taps(in_size: int, out_size: int, align_corners: bool, scale: float | None, double: bool = False
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(i0, i1, w0, w1) of torch's linear resampling along one axis, in float32 as torch computes them (in
    float64 for a float64 tensor, whose accumulate type is double)."""
    f32: Any = np.float64 if double else np.float32
    dst = np.arange(out_size, dtype=f32)
    if align_corners:
        step = f32(in_size - 1) / f32(out_size - 1) if out_size > 1 else f32(0)
        src = dst * step
    else:
        step = f32(1.0 / scale) if scale else f32(in_size) / f32(out_size)
        src = np.maximum(step * (dst + f32(0.5)) - f32(0.5), f32(0))
    i0 = np.minimum(src.astype(np.int64), in_size - 1)
    i1 = np.minimum(i0 + 1, in_size - 1)
    w1 = (src - i0.astype(f32)).astype(f32)
    return i0, i1, (f32(1) - w1).astype(f32), w1


@handles("aten.upsample_bilinear2d.vec", "aten.upsample_bilinear2d.default")
def _upsample_bilinear(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["input"])
    if not ctx.b.dtype(x).is_float:
        ctx.unsupported("bilinear resampling of integers")
    rank = len(ctx.b.shape(x))
    scales = a.get("scale_factors") or [a.get("scales_h"), a.get("scales_w")]
    out_hw = ctx.out_shape(node)[-2:]
    b = ctx.b
    # Width first, then height: the same weighted sums, in the same order, as torch's kernel.
    for axis, out_size, scale in ((rank - 1, out_hw[1], scales[1]), (rank - 2, out_hw[0], scales[0])):
        in_size = b.shape(x)[axis]
        double = b.dtype(x) is DType.float64
        i0, i1, w0, w1 = _linear_taps(in_size, out_size, bool(a["align_corners"]), scale, double)
        wdt = DType.float64 if double else None  # float32 weights otherwise, as before
        view = [1] * rank
        view[axis] = out_size
        lo = b.binary("mul", b.emit("gather", [x, b.const(i0)], axis=axis), b.const(w0.reshape(view), wdt))
        hi = b.binary("mul", b.emit("gather", [x, b.const(i1)], axis=axis), b.const(w1.reshape(view), wdt))
        x = b.binary("add", lo, hi)
    return x
