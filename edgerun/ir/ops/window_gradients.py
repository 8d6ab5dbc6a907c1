"""Vector-Jacobian products of conv2d, max_pool2d and avg_pool2d (ops/atomic.py).

conv2d's input cotangent is the transposed convolution of the output's cotangent with the same weight (whose
[out, in/groups, kh, kw] layout is conv_transpose2d's [in, out/groups, kh, kw] read the other way); its weight
cotangent, at stride 1 with one group, is one matrix product of the input's windows (im2col, a raster) and the
output's cotangent, else one more convolution, of the input (batch and channels swapped, groups kept apart)
by the output's cotangent, with stride and dilation exchanged. A pooling window's taps are written as rasters from
the input (one region per tap), so its cotangent is those regions transposed (ops/raster_gradient.py): max
pooling sends each window's cotangent to the first tap holding the max (torch's choice), average pooling to
every tap divided by the window's count. A max pool whose windows tile the input is differentiated at the
input's shape instead, without one stacked copy per tap (_max_pool_tiled).
"""

from __future__ import annotations

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Node
from edgerun.ir.ops._grad import as_float, reshape_to
from edgerun.ir.ops.atomic import conv_geometry, pool_geometry
from edgerun.ir.ops.raster_gradient import transpose_regions
from edgerun.ir.region import Region
from edgerun.ir.registry import register_gradient

Grads = list[str | None]
# The weight cotangent's im2col windows (kh*kw*ci x n*ho*wo) are materialised up to this many elements (16 MB
# in float32); above it, the convolution that reads the input in place.
MAX_IM2COL_ELEMENTS = 1 << 22
# The node meta key naming the conv2d whose input a weight cotangent's im2col windows lay out.
WINDOWS_OF = "im2col_of"


@register_gradient("conv2d")
def _conv2d(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g = grads[0]
    out: Grads = [None] * len(node.inputs)
    if g is None:
        return out
    x, w = node.inputs[0], node.inputs[1]
    (sh, sw), (pt, pl, pb, pr), (dh, dw), groups = conv_geometry(node.attrs)
    n, _, h, wd = b.shape(x)
    _, ci, kh, kw = b.shape(w)
    _, _, ho, wo = b.shape(g)
    if needs[0]:
        end_h = (ho - 1) * sh + (kh - 1) * dh + 1 - pt - h  # crop so the transposed conv gives back h rows
        end_w = (wo - 1) * sw + (kw - 1) * dw + 1 - pl - wd
        out[0] = b.emit("conv_transpose2d", [g, w], stride=[sh, sw], dilation=[dh, dw],
                        padding=[pt, pl, end_h, end_w], groups=groups)
    if needs[1] and groups == 1 and (sh, sw) == (1, 1) and kh * kw * ci * n * ho * wo <= MAX_IM2COL_ELEMENTS:
        out[1] = _conv_weight_gradient_gemm(b, node, g)
    elif needs[1]:
        xs = reshape_to(b, x, [n, groups, ci, h, wd])
        xs = reshape_to(b, b.emit("transpose", [xs], perm=[2, 1, 0, 3, 4]), [ci, groups * n, h, wd])
        gs = b.emit("transpose", [g], perm=[1, 0, 2, 3])  # [groups * co, n, ho, wo]
        full = b.emit("conv2d", [xs, gs], stride=[dh, dw], dilation=[sh, sw], padding=[pt, pl, pb, pr],
                      groups=groups)  # [ci, groups * co, kh', kw'], kh' >= kh
        if b.shape(full)[2:] != (kh, kw):
            full = b.emit("slice", [full], starts=[0, 0], ends=[kh, kw], axes=[2, 3])
        out[1] = b.emit("transpose", [full], perm=[1, 0, 2, 3])
    if len(node.inputs) > 2 and node.inputs[2] and needs[2]:
        out[2] = b.emit("reduce_sum", [g], axes=[0, 2, 3])
    return out


def _conv_weight_gradient_gemm(b: Builder, node: Node, g: str) -> str:
    """conv2d's weight cotangent (stride 1, one group) as one matrix product: the output's cotangent as
    [co, (ho, wo, n)] times the transpose of the input's windows laid out as col [(ci, tap), (ho, wo, n)]
    (im2col, zero where a tap reads padding), which lands in the weight's [co, ci, kh, kw] layout. At a device's
    training sizes the planes are small and a direct convolution with batch and channels swapped spends its
    time on layout (a digits CNN's [32, 32, 4, 4] layer on ONNX Runtime, one thread, its profiler: 485 us for
    that convolution, 184 us for this GEMM). The batch is innermost so that a tap's window is rows of
    (columns x batch) elements, long runs for the layout copies; the product's operand is read transposed
    (ONNX Runtime's Gemm transB), and with rows ordered (tap, ci) instead a [3, 3, 32, 64] transpose of the
    product took 77 us of that step."""
    x = node.inputs[0]
    _, (pt, pl, _, _), (dh, dw), _ = conv_geometry(node.attrs)
    n, ci, h, wd = b.shape(x)
    co, _, kh, kw = b.shape(node.inputs[1])
    _, _, ho, wo = b.shape(g)
    plane, taps = ho * wo, kh * kw
    xt = b.emit("raster", [x], shape=[ci, h, wd, n], fill=None,  # x as [ci, h, w, n]
                regions=[Region(0, 0, (ci * h * wd, h * wd, 1), 0, (1, h * wd * n, n), (n, ci, h * wd)).to_list()])
    regions = []
    for ki in range(kh):
        for kj in range(kw):
            rows = [o for o in range(ho) if 0 <= o + ki * dh - pt < h]
            cols = [o for o in range(wo) if 0 <= o + kj * dw - pl < wd]
            if rows and cols:
                ih, iw = rows[0] + ki * dh - pt, cols[0] + kj * dw - pl
                regions.append(Region(0, (ih * wd + iw) * n, (h * wd * n, wd * n, 1),
                                      (ki * kw + kj) * plane * n + (rows[0] * wo + cols[0]) * n,
                                      (taps * plane * n, wo * n, 1), (ci, len(rows), len(cols) * n)).to_list())
    meta = b.meta
    b.meta = {**meta, WINDOWS_OF: node.name}  # passes/conv_over_windows.py computes the forward from them
    col = b.emit("raster", [xt], shape=[ci * taps, plane * n], fill=0.0, regions=regions)
    b.meta = meta
    gm = b.emit("raster", [g], shape=[co, plane * n], fill=None,  # g [n, co, (ho, wo)] as [co, (ho, wo, n)]
                regions=[Region(0, 0, (plane, 1, co * plane), 0, (plane * n, n, 1), (co, plane, n)).to_list()])
    gw = b.emit("matmul", [gm, b.emit("transpose", [col], perm=[1, 0])])  # [co, (ci, tap)]
    return reshape_to(b, gw, [co, ci, kh, kw])


def _tap_regions(node: Node, x_shape: tuple[int, ...], y_shape: tuple[int, ...],
                 stacked: bool) -> list[Region]:
    """One region per window tap copying the input elements it sees to the outputs they count for: into
    [taps, N, C, Ho, Wo] when `stacked`, else all onto [N, C, Ho, Wo]. Taps in the padding are left out."""
    (kh, kw), (sh, sw), (pt, pl, _, _), (dh, dw), _ = pool_geometry(node.attrs)
    n, c, h, w = x_shape
    ho, wo = y_shape[2], y_shape[3]
    plane = ho * wo * n * c
    regions = []
    for ki in range(kh):
        for kj in range(kw):
            rows = [o for o in range(ho) if 0 <= o * sh + ki * dh - pt < h]
            cols = [o for o in range(wo) if 0 <= o * sw + kj * dw - pl < w]
            if not rows or not cols:
                continue
            ih, iw = rows[0] * sh + ki * dh - pt, cols[0] * sw + kj * dw - pl
            tap = ki * kw + kj
            regions.append(Region(0, ih * w + iw, (h * w, sh * w, sw),
                                  (tap * plane if stacked else 0) + rows[0] * wo + cols[0], (ho * wo, wo, 1),
                                  (n * c, len(rows), len(cols))))
    return regions


@register_gradient("max_pool2d")
def _max_pool(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g = grads[0]
    if g is None or not needs[0]:
        return [None]
    tiled = _max_pool_tiled(b, node, g)
    if tiled is not None:
        return [tiled]
    x, y = node.inputs[0], node.outputs[0]
    (kh, kw) = pool_geometry(node.attrs)[0]
    taps = kh * kw
    y_shape = b.shape(y)
    regions = _tap_regions(node, b.shape(x), y_shape, stacked=True)
    windows = b.emit("raster", [x], shape=[taps, *y_shape], fill=float("-inf"),
                     regions=[r.to_list() for r in regions])
    index = b.const(np.arange(taps).reshape(taps, 1, 1, 1, 1), b.dtype(g))
    hit = b.binary("eq", windows, y)
    first = b.emit("reduce_min", [b.emit("where", [hit, index, b.scalar(float(taps), g)])], axes=[0],
                   keepdims=True)
    chosen = b.emit("where", [b.binary("eq", index, first), g, b.scalar(0.0, g)])
    return [transpose_regions(b, chosen, regions, 0, b.shape(x))]


def _tiles(node: Node, x_shape: tuple[int, ...], y_hw: tuple[int, ...]) -> bool:
    """Whether the pool's windows tile its input: stride = kernel, no padding or dilation, nothing left over."""
    (kh, kw), stride, pads, dilation, _ = pool_geometry(node.attrs)
    return (stride == (kh, kw) and not any(pads) and dilation == (1, 1)
            and tuple(x_shape[2:]) == (y_hw[0] * kh, y_hw[1] * kw))


def _spread(b: Builder, v: str, kernel: tuple[int, int], x_shape: tuple[int, ...]) -> str:
    """[n, c, ho, wo] -> the input's [n, c, h, w], each window's value on its every tap (tiling windows)."""
    return b.emit("resize", [v], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor",
                  scales=[1.0, 1.0, float(kernel[0]), float(kernel[1])], shape=list(x_shape))


def _max_pool_tiled(b: Builder, node: Node, g: str) -> str | None:
    """The max pool's input cotangent when its windows tile the input (stride = kernel, no padding or
    dilation, no rows or columns left over), at x's shape without a stacked window per tap: each input
    element's window values (y, and the window's tie-break sum) and cotangent are a nearest resize away.
    A tap holding the max gets code 2^(taps - 1 - tap), so the window's first such tap (torch's choice) is
    the one whose code is over half the window's sum of codes: the sum's highest set bit. Those sums stay
    exact integers in float32 up to 16 taps (the mean's rounding is far under the margin of 1/2).
    On ONNX Runtime, for a digits CNN's [32, 32, 8, 8] pool at one thread, this was 215 us where the
    stacked windows' slices, concat and where took 650 us. The cotangent is masked by a product, not a
    `where` (ONNX Runtime's is slow): a non-finite cotangent spreads NaN over its window's other taps, which the
    train step's finiteness guard skips as it skips any non-finite gradient. None when the windows do not tile
    the input."""
    x, y = node.inputs[0], node.outputs[0]
    kh, kw = pool_geometry(node.attrs)[0]
    n, c, h, w = b.shape(x)
    ho, wo = b.shape(y)[2:]
    taps = kh * kw
    if not _tiles(node, (n, c, h, w), (ho, wo)) or taps > 16 or b.dtype(g) not in (DType.float32, DType.float64):
        return None

    def spread(v: str) -> str:
        return _spread(b, v, (kh, kw), (n, c, h, w))

    codes = np.tile(2.0 ** (taps - 1 - np.arange(taps)).reshape(kh, kw), (ho, wo))
    code = b.binary("mul", as_float(b, b.binary("eq", x, spread(y)), g), b.const(codes, b.dtype(g)))
    mean = b.emit("avg_pool2d", [code], kernel=[kh, kw], stride=[kh, kw])
    half_sum = b.binary("mul", mean, b.scalar(taps / 2, g))
    first = b.binary("gt", code, spread(half_sum))
    return b.binary("mul", as_float(b, first, g), spread(g))


@register_gradient("avg_pool2d")
def _avg_pool(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g = grads[0]
    if g is None or not needs[0]:
        return [None]
    x = node.inputs[0]
    x_shape, y_shape = b.shape(x), b.shape(g)
    (kh, kw), (sh, sw), (pt, pl, pb, pr), _, _ = pool_geometry(node.attrs)
    h, w = x_shape[2], x_shape[3]
    # The divisor the kernel used (oracle/kernels.py's avg_pool2d): taps inside the input, plus the padding
    # when count_include_pad, never the ceil_mode overhang past the padding.
    rows = np.arange(y_shape[2]) * sh - pt
    cols = np.arange(y_shape[3]) * sw - pl
    include_pad = node.attrs.get("count_include_pad", True)
    lo_r, lo_c = (-pt, -pl) if include_pad else (0, 0)
    hi_r, hi_c = (h + pb, w + pr) if include_pad else (h, w)
    count = (np.minimum(rows + kh, hi_r) - np.maximum(rows, lo_r))[:, None] * \
        (np.minimum(cols + kw, hi_c) - np.maximum(cols, lo_c))[None, :]
    share = b.binary("mul", g, b.const((1.0 / count).astype(b.dtype(g).np), b.dtype(g)))
    if _tiles(node, x_shape, y_shape[2:]):  # one nearest resize, not a region per tap
        return [_spread(b, share, (kh, kw), x_shape)]
    regions = _tap_regions(node, x_shape, y_shape, stacked=False)
    return [transpose_regions(b, share, regions, 0, x_shape, every_write_live=True)]
