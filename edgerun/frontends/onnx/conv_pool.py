"""Conv, ConvTranspose and pooling. 1-D ops run as 2-D with a unit height; 3-D ones are refused.

ONNX pads are [x1_begin, x2_begin, ..., x1_end, x2_end, ...]; ours are [top, left, bottom, right].
auto_pad SAME_* is resolved here into explicit pads from the static input shape.
"""

from __future__ import annotations

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.frontends.onnx.symfold import is_symbolic
from edgerun.ir.dtypes import DType
from edgerun.ir.symbolic import SymDim, sym_max


def _as_2d(ctx: ImportContext, node: OnnxNode, x: str) -> tuple[str, bool]:
    shp = ctx.b.shape(x)
    if len(shp) == 3:
        return ctx.emit("reshape", [x], shape=[shp[0], shp[1], 1, shp[2]]), True
    if len(shp) != 4:
        raise node.refuse(f"{len(shp) - 2}-D {node.op_type} (1-D and 2-D are supported)")
    return x, False


def _spatial(node: OnnxNode, key: str, default: int, n: int) -> list[int]:
    v = node.attr(key)
    return [int(a) for a in v] if v is not None else [default] * n


def _pads(node: OnnxNode, in_sizes: list[int], kernel: list[int], strides: list[int],
          dilations: list[int], ceil_mode: bool = False) -> tuple[list[int], list[int]]:
    """(begin pads, end pads) per spatial axis, resolving auto_pad."""
    n = len(in_sizes)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        begin, end = [], []
        for size, k, s, d in zip(in_sizes, kernel, strides, dilations):
            total = sym_max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            small, big = total // 2, total - total // 2
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
        return begin, end
    if auto == "VALID":
        return [0] * n, [0] * n
    if auto not in ("NOTSET", ""):
        raise node.refuse(f"auto_pad {auto!r}")
    pads = _spatial(node, "pads", 0, 2 * n)
    return pads[:n], pads[n:]


def _lift(vals: list[int], lifted: bool, fill: int) -> list[int]:
    return [fill, *vals] if lifted else vals


@onnx_op("Conv")
def conv(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [conv_values(ctx, node, ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2))]


def conv_values(ctx: ImportContext, node: OnnxNode, x0: str, w: str, bias: str,
                zero_points: tuple[str, str] | None = None) -> str:
    """Conv of IR values x0, w and optional bias ('') with node's attributes.

    With `zero_points` (input, weight) it is an exact integer conv_integer instead (edgerun/frontends/onnx/quantized.py).
    """
    x, lifted = _as_2d(ctx, node, x0)
    wshape = ctx.b.shape(w)
    if lifted:
        w = ctx.emit("reshape", [w], shape=[wshape[0], wshape[1], 1, wshape[2]])
    n = len(wshape) - 2
    kernel = _spatial(node, "kernel_shape", 0, n) if node.attr("kernel_shape") else list(wshape[2:])
    strides, dil = _spatial(node, "strides", 1, n), _spatial(node, "dilations", 1, n)
    in_sizes = list(ctx.b.shape(x0)[2:])
    begin, end = _pads(node, in_sizes, kernel, strides, dil)
    begin, end = _lift(begin, lifted, 0), _lift(end, lifted, 0)
    ins = [x, w] + (list(zero_points) if zero_points else [bias] if bias else [])
    half = ctx.b.dtype(x) is DType.float16
    if half:  # accumulate half precision in single and round once, as the ONNX reference does
        ins = [ctx.cast(v, DType.float32) for v in ins]
    y = ctx.emit("conv_integer" if zero_points else "conv2d", ins, stride=_lift(strides, lifted, 1), dilation=_lift(dil, lifted, 1),
                 padding=[begin[0], begin[1], end[0], end[1]], groups=int(node.attr("group", 1)))
    if half:
        y = ctx.cast(y, DType.float16)
    if lifted:
        s = ctx.b.shape(y)
        y = ctx.emit("reshape", [y], shape=[s[0], s[1], s[3]])
    return y


@onnx_op("ConvTranspose")
def conv_transpose(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # Static sizes: the IR's conv_transpose2d composite. Symbolic ones: its lowering written out here, since
    # the zero insertion's raster needs concrete sizes: zero-insertion + pad/crop + a plain convolution with
    # the kernel flipped and its in/out channels swapped per group.
    x0 = ctx.input(node, 0)
    x, lifted = _as_2d(ctx, node, x0)
    wshape = ctx.shape(node.inputs[1])
    if lifted:
        wshape = (wshape[0], wshape[1], 1, wshape[2])
    groups = int(node.attr("group", 1))
    cin, cout_g, kh, kw = wshape
    n_sp = len(ctx.b.shape(x0)) - 2
    strides = _lift(_spatial(node, "strides", 1, n_sp), lifted, 1)
    dil = _lift(_spatial(node, "dilations", 1, n_sp), lifted, 1)
    out_pad = _lift(_spatial(node, "output_padding", 0, n_sp), lifted, 0)
    in_sizes = list(ctx.b.shape(x)[2:])
    kernel = [kh, kw]
    auto = node.attr("auto_pad", "NOTSET")
    out_shape = node.attr("output_shape")
    if out_shape is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        target = _lift([int(v) for v in out_shape][-n_sp:], lifted, 1) if out_shape is not None else \
            [s * i for s, i in zip(strides, in_sizes)]
        begin, end = [], []
        for size, k, s, d, op, t in zip(in_sizes, kernel, strides, dil, out_pad, target):
            total = s * (size - 1) + op + (k - 1) * d + 1 - t
            small, big = total // 2, total - total // 2
            # ONNX gives the start the smaller half only under SAME_UPPER (the reverse of Conv).
            begin.append(small if auto == "SAME_UPPER" else big)
            end.append(big if auto == "SAME_UPPER" else small)
    elif auto == "VALID":
        begin, end = [0, 0], [0, 0]
    else:
        p = _spatial(node, "pads", 0, 2 * n_sp)
        begin, end = _lift(p[:n_sp], lifted, 0), _lift(p[n_sp:], lifted, 0)
    if not any(isinstance(d, SymDim) for d in ctx.b.shape(x)):
        # The IR's composite, kept whole for engines with a ConvTranspose kernel (lowered as below elsewhere).
        w = ctx.input(node, 1)
        if lifted:
            w = ctx.emit("reshape", [w], shape=list(wshape))
        bias = [ctx.input(node, 2)] if node.has_input(2) else []
        y = ctx.emit("conv_transpose2d", [x, w, *bias], stride=strides, dilation=dil,
                     padding=[begin[0], begin[1], end[0], end[1]], output_padding=out_pad, groups=groups)
        if lifted:
            s = ctx.b.shape(y)
            y = ctx.emit("reshape", [y], shape=[s[0], s[1], s[3]])
        return [y]
    spread = _insert_zeros(ctx, x, strides)
    pairs = [[0, 0], [0, 0]] + [[d * (k - 1) - b, d * (k - 1) - e + op]
                                for k, d, b, e, op in zip(kernel, dil, begin, end, out_pad)]
    padded = ctx.emit("pad", [spread], pads=pairs, mode="constant", value=0.0)
    weight = _flipped_kernel(ctx, node.inputs[1], (cin, cout_g, kh, kw), groups)
    ins = [padded, weight] + ([ctx.input(node, 2)] if node.has_input(2) else [])
    y = ctx.emit("conv2d", ins, dilation=dil, groups=groups)
    if lifted:
        s = ctx.b.shape(y)
        y = ctx.emit("reshape", [y], shape=[s[0], s[1], s[3]])
    return [y]


def _flipped_kernel(ctx: ImportContext, name: str, shape: tuple[int, int, int, int], groups: int) -> str:
    """ConvTranspose's weight [Cin, Cout/g, kh, kw] as the equivalent Conv's: flipped, in/out swapped per group.

    A constant weight is rearranged at import time; a weight computed at run time (or fed as an input) gets
    the same rearrangement as graph ops (two reversals, a transpose), so it needs no freezing.
    """
    cin, cout_g, kh, kw = shape
    cin_g = cin // groups
    wc = ctx.const(name)
    if wc is not None and not is_symbolic(wc):
        wc = wc.reshape(shape)
        flipped = wc[:, :, ::-1, ::-1].reshape(groups, cin_g, cout_g, kh, kw).transpose(0, 2, 1, 3, 4)
        return ctx.b.const(np.ascontiguousarray(flipped.reshape(groups * cout_g, cin_g, kh, kw)))
    from edgerun.frontends.onnx.shape import reverse_axis
    w = ctx.emit("reshape", [ctx.value(name)], shape=list(shape))
    w = reverse_axis(ctx, reverse_axis(ctx, w, 2), 3)
    w = ctx.emit("reshape", [w], shape=[groups, cin_g, cout_g, kh, kw])
    w = ctx.emit("transpose", [w], perm=[0, 2, 1, 3, 4])
    return ctx.emit("reshape", [w], shape=[groups * cout_g, cin_g, kh, kw])


def _insert_zeros(ctx: ImportContext, x: str, strides: list[int]) -> str:
    """x [N, C, H, W] with strides-1 zeros between neighbours along H and W: [N, C, (H-1)*sh+1, (W-1)*sw+1]."""
    nb, c, h, w = ctx.b.shape(x)
    dh, dw = (h - 1) * strides[0] + 1, (w - 1) * strides[1] + 1
    if any(isinstance(d, SymDim) for d in (nb, c, h, w)):
        # A raster's regions are concrete; with symbolic sizes the same spread is a pad of [.., H, 1, W, 1] to
        # [.., H, sh, W, sw], merged back and cut after the last element.
        cells = ctx.emit("reshape", [x], shape=[nb, c, h, 1, w, 1])
        gaps = [[0, 0]] * 3 + [[0, strides[0] - 1], [0, 0], [0, strides[1] - 1]]
        grid = ctx.emit("pad", [cells], pads=gaps, mode="constant", value=0.0)
        merged = ctx.emit("reshape", [grid], shape=[nb, c, h * strides[0], w * strides[1]])
        return ctx.emit("slice", [merged], starts=[0, 0], ends=[dh, dw], axes=[2, 3])
    from edgerun.ir.ops.raster import strided_copy_regions
    regions = strided_copy_regions(0, 0, [c * h * w, h * w, w, 1], 0, [c * dh * dw, dh * dw, strides[0] * dw, strides[1]],
                                   [nb, c, h, w])
    return ctx.emit("raster", [x], regions=regions, shape=[nb, c, dh, dw], fill=0.0)


def _out_size(size: int, k: int, s: int, d: int, pb: int, pe: int, ceil_mode: bool) -> int:
    span = d * (k - 1) + 1
    num = size + pb + pe - span
    out = (-(-num // s) if ceil_mode else num // s) + 1
    return out - 1 if ceil_mode and (out - 1) * s >= size + pb else out


def _tap_sum(ctx: ImportContext, node: OnnxNode, x: str, kernel: list[int], strides: list[int], dil: list[int],
             begin: list[int], end: list[int], ceil_mode: bool, include_pad: bool, average: bool) -> str:
    """Window sums (or averages) as a sum of strided slices, one per kernel tap; any dilation."""
    _, _, h, w = ctx.b.shape(x)
    outs = [_out_size(n, k, s, d, b, e, ceil_mode) for n, k, s, d, b, e in zip((h, w), kernel, strides, dil, begin, end)]
    spans = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(outs, strides, dil, kernel)]
    tails = [max(e, sp - n - b) for e, sp, n, b in zip(end, spans, (h, w), begin)]
    xp = ctx.emit("pad", [x], pads=[[0, 0], [0, 0], [begin[0], tails[0]], [begin[1], tails[1]]], mode="constant",
                  value=0.0)
    total = ""
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            tap = ctx.emit("slice", [xp], starts=[i * dil[0], j * dil[1]],
                           ends=[i * dil[0] + (outs[0] - 1) * strides[0] + 1, j * dil[1] + (outs[1] - 1) * strides[1] + 1],
                           axes=[2, 3], steps=strides)
            total = ctx.emit("add", [total, tap]) if total else tap
    if not average:
        return total
    counts = []
    for n, k, s, d, b, e, o in zip((h, w), kernel, strides, dil, begin, end, outs):
        pos = np.arange(o)[:, None] * s + np.arange(k)[None, :] * d
        valid = pos < n + b + e if include_pad else (pos >= b) & (pos < b + n)
        counts.append(valid.sum(axis=1))
    divisor = np.outer(counts[0], counts[1]).astype(ctx.b.dtype(x).np)
    return ctx.emit("div", [total, ctx.b.const(divisor)])


def _pool2d(ctx: ImportContext, node: OnnxNode, x: str, kernel: list[int], strides: list[int], dil: list[int],
            begin: list[int], end: list[int], ceil_mode: bool, include_pad: bool) -> str:
    op = node.op_type
    wide = any(2 * q > k * d for q, k, d in zip(begin + end, kernel * 2, dil * 2))
    if op == "LpPool" or (op == "AveragePool" and (dil != [1, 1] or wide)):
        return _tap_sum(ctx, node, x, kernel, strides, dil, begin, end, ceil_mode, include_pad, op != "LpPool")
    if wide:
        # Padding wider than our atomic max pool takes: pad explicitly with -inf.
        if ceil_mode:
            raise node.refuse("ceil_mode with padding larger than half the window")
        fill = -np.inf if op == "MaxPool" else 0.0
        pairs = [[0, 0], [0, 0], [begin[0], end[0]], [begin[1], end[1]]]
        x = ctx.emit("pad", [x], pads=pairs, mode="constant", value=fill)
        begin, end = [0, 0], [0, 0]
    attrs = {"kernel": kernel, "stride": strides, "dilation": dil,
             "padding": [begin[0], begin[1], end[0], end[1]], "ceil_mode": ceil_mode}
    if op == "MaxPool":
        return ctx.emit("max_pool2d", [x], **attrs)
    return ctx.emit("avg_pool2d", [x], count_include_pad=include_pad, **attrs)


@onnx_op("MaxPool", "AveragePool", "LpPool")
def pool(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # 1-D pools run as 2-D with a unit height; 3-D ones as a 2-D pool over (H, W) and then one over D.
    # Box windows factor per axis (including the averaging divisor), so this is exact.
    x = ctx.input(node, 0)
    shape = list(ctx.b.shape(x))
    if len([o for o in node.outputs if o]) > 1:
        return _max_pool_with_indices(ctx, node, x)
    kernel = [int(k) for k in node.attr("kernel_shape")]
    n = len(kernel)
    if n not in (1, 2, 3) or len(shape) != n + 2:
        raise node.refuse(f"{n}-D {node.op_type}")
    strides, dil = _spatial(node, "strides", 1, n), _spatial(node, "dilations", 1, n)
    ceil_mode = bool(node.attr("ceil_mode", 0))
    begin, end = _pads(node, shape[2:], kernel, strides, dil, ceil_mode)
    op = node.op_type
    include_pad = bool(node.attr("count_include_pad", 0)) or op == "LpPool"
    p = float(node.attr("p", 2))
    if op == "LpPool":
        # (sum |x|^p)^(1/p): window sums of |x|^p, zero padding adding nothing
        x = ctx.emit("pow", [ctx.emit("abs", [x]), ctx.scalar(p, x)])
    if n == 1:
        x = ctx.emit("reshape", [x], shape=[shape[0], shape[1], 1, shape[2]])
        y = _pool2d(ctx, node, x, [1, *kernel], [1, *strides], [1, *dil], [0, *begin], [0, *end], ceil_mode,
                    include_pad)
        y = ctx.emit("reshape", [y], shape=[shape[0], shape[1], ctx.b.shape(y)[3]])
    elif n == 2:
        y = _pool2d(ctx, node, x, kernel, strides, dil, begin, end, ceil_mode, include_pad)
    else:
        nb, c, d, h, w = shape
        hw = _pool2d(ctx, node, ctx.emit("reshape", [x], shape=[nb, c * d, h, w]), kernel[1:], strides[1:],
                     dil[1:], begin[1:], end[1:], ceil_mode, include_pad)
        oh, ow = ctx.b.shape(hw)[2:]
        y = _pool2d(ctx, node, ctx.emit("reshape", [hw], shape=[nb, c, d, oh * ow]), [kernel[0], 1],
                    [strides[0], 1], [dil[0], 1], [begin[0], 0], [end[0], 0], ceil_mode, include_pad)
        y = ctx.emit("reshape", [y], shape=[nb, c, ctx.b.shape(y)[2], oh, ow])
    if op == "LpPool":
        y = ctx.emit("pow", [y, ctx.scalar(1.0 / p, y)])
    return [y]


@onnx_op("Col2Im")
def col2im(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # Each kernel tap's column block lands on a strided grid of the padded image (one raster with zero
    # fill); overlapping taps add up.
    from edgerun.ir.ops.raster import strided_copy_regions
    x = ctx.input(node, 0)
    image = [int(v) for v in ctx.static(node, 1, "image_shape").reshape(-1)]  # type: ignore[union-attr]
    block = [int(v) for v in ctx.static(node, 2, "block_shape").reshape(-1)]  # type: ignore[union-attr]
    if len(image) != 2:
        raise node.refuse(f"{len(image)}-D Col2Im")
    dil, strides = _spatial(node, "dilations", 1, 2), _spatial(node, "strides", 1, 2)
    pads = _spatial(node, "pads", 0, 4)
    n, cols, length = ctx.b.shape(x)
    c = cols // (block[0] * block[1])
    hp, wp = image[0] + pads[0] + pads[2], image[1] + pads[1] + pads[3]
    oh = (hp - (dil[0] * (block[0] - 1) + 1)) // strides[0] + 1
    ow = (wp - (dil[1] * (block[1] - 1) + 1)) // strides[1] + 1
    if oh * ow != length:
        raise ValueError(f"Col2Im: {length} columns do not fit a {oh}x{ow} grid")
    blocks = ctx.emit("reshape", [x], shape=[n, c, block[0] * block[1], oh, ow])
    total = ""
    for i in range(block[0]):
        for j in range(block[1]):
            tap = ctx.emit("slice", [blocks], starts=[i * block[1] + j], ends=[i * block[1] + j + 1], axes=[2])
            regions = strided_copy_regions(0, 0, [c * oh * ow, oh * ow, ow, 1], i * dil[0] * wp + j * dil[1],
                                           [c * hp * wp, hp * wp, strides[0] * wp, strides[1]], [n, c, oh, ow])
            placed = ctx.emit("raster", [tap], regions=regions, shape=[n, c, hp, wp], fill=0.0)
            total = ctx.emit("add", [total, placed]) if total else placed
    return [ctx.emit("slice", [total], starts=[pads[0], pads[1]], ends=[pads[0] + image[0], pads[1] + image[1]],
                     axes=[2, 3])]


def _max_pool_with_indices(ctx: ImportContext, node: OnnxNode, x: str) -> list[Out]:
    """MaxPool's values and flat row-major argmax indices: a running max over the kernel taps, in window
    order, where only a strictly larger value moves the index (the first maximum wins, as in the spec)."""
    shape = list(ctx.b.shape(x))
    if len(shape) != 4:
        raise node.refuse(f"the Indices output of a {len(shape) - 2}-D MaxPool")
    kernel = [int(k) for k in node.attr("kernel_shape")]
    strides, dil = _spatial(node, "strides", 1, 2), _spatial(node, "dilations", 1, 2)
    ceil_mode = bool(node.attr("ceil_mode", 0))
    begin, end = _pads(node, shape[2:], kernel, strides, dil, ceil_mode)
    nb, c, h, w = shape
    outs = [_out_size(n, k, s, d, b, e, ceil_mode)
            for n, k, s, d, b, e in zip((h, w), kernel, strides, dil, begin, end)]
    spans = [(o - 1) * s + d * (k - 1) + 1 for o, s, d, k in zip(outs, strides, dil, kernel)]
    tails = [max(e, sp - n - b) for e, sp, n, b in zip(end, spans, (h, w), begin)]
    xp = ctx.emit("pad", [x], pads=[[0, 0], [0, 0], [begin[0], tails[0]], [begin[1], tails[1]]], mode="constant",
                  value=float("-inf"))
    base = (np.arange(nb * c, dtype=np.int64) * h * w).reshape(nb, c, 1, 1)
    best, index = "", ""
    for i in range(kernel[0]):
        for j in range(kernel[1]):
            tap = ctx.emit("slice", [xp], starts=[i * dil[0], j * dil[1]],
                           ends=[i * dil[0] + (outs[0] - 1) * strides[0] + 1,
                                 j * dil[1] + (outs[1] - 1) * strides[1] + 1], axes=[2, 3], steps=strides)
            rows = np.arange(outs[0]) * strides[0] + i * dil[0] - begin[0]
            cols = np.arange(outs[1]) * strides[1] + j * dil[1] - begin[1]
            # storage_order=1 numbers the elements of each plane column by column.
            flat = cols[None, :] * h + rows[:, None] if node.attr("storage_order", 0) else rows[:, None] * w + cols[None, :]
            where = ctx.b.const(base + flat.astype(np.int64))
            if not best:
                best, index = tap, ctx.emit("expand", [where], shape=[nb, c, outs[0], outs[1]])
                continue
            better = ctx.emit("gt", [tap, best])
            best = ctx.emit("where", [better, tap, best])
            index = ctx.emit("where", [better, where, index])
    return [best, index]
