"""Linear (de)quantisation ONNX ops for int8/uint8, written as casts and float arithmetic.

QuantizeLinear rounds half to even and saturates, as the spec says; QLinearMatMul and the *Integer ops
dequantise, multiply in float32 or int32, and requantise. Block-wise scales are refused.
"""

from __future__ import annotations

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType


def _per_axis(ctx: ImportContext, node: OnnxNode, v: str, rank: int, axis_attr: str = "axis") -> str:
    """A 1-D per-channel scale or zero point reshaped to broadcast along the quantisation axis."""
    shape = ctx.b.shape(v)
    if len(shape) == 0 or (len(shape) == 1 and shape[0] == 1):
        return v
    if len(shape) != 1 or node.attr("block_size", 0):
        raise node.refuse("block-wise quantisation")
    axis = int(node.attr(axis_attr, 1)) % rank
    view = [1] * rank
    view[axis] = shape[0]
    return ctx.emit("reshape", [v], shape=view)


def dequantize(ctx: ImportContext, node: OnnxNode, x: str, scale: str, zp: str) -> str:
    rank = len(ctx.b.shape(x))
    xf = ctx.cast(x, DType.float32)
    if zp:
        xf = ctx.emit("sub", [xf, ctx.cast(_per_axis(ctx, node, zp, rank), DType.float32)])
    return ctx.emit("mul", [xf, _per_axis(ctx, node, ctx.cast(scale, DType.float32), rank)])


def quantize(ctx: ImportContext, node: OnnxNode, x: str, scale: str, zp: str, out: DType) -> str:
    rank = len(ctx.b.shape(x))
    y = ctx.emit("round", [ctx.emit("div", [ctx.cast(x, DType.float32),
                                            _per_axis(ctx, node, ctx.cast(scale, DType.float32), rank)])])
    if zp:
        y = ctx.emit("add", [y, ctx.cast(_per_axis(ctx, node, zp, rank), DType.float32)])
    lo, hi = (-128.0, 127.0) if out is DType.int8 else (0.0, 255.0)
    y = ctx.emit("minimum", [ctx.emit("maximum", [y, ctx.scalar(lo, y)]), ctx.scalar(hi, y)])
    return ctx.cast(y, out)


def _target(ctx: ImportContext, node: OnnxNode, zp_index: int) -> DType:
    if node.has_input(zp_index):
        dtype = ctx.dtype(node.inputs[zp_index])
    elif "output_dtype" in node.attrs and node.attr("output_dtype"):
        from edgerun.frontends.onnx.context import onnx_dtype
        dtype = onnx_dtype(int(node.attr("output_dtype")), "QuantizeLinear output_dtype")
    else:
        dtype = DType.uint8
    if dtype not in (DType.int8, DType.uint8):
        raise node.refuse(f"quantisation to {dtype.value}")
    return dtype


@onnx_op("QuantizeLinear")
def quantize_linear(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    out = _target(ctx, node, 2)
    return [quantize(ctx, node, ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2), out)]


@onnx_op("DequantizeLinear")
def dequantize_linear(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    y = dequantize(ctx, node, x, ctx.input(node, 1), ctx.input(node, 2))
    scale_dtype = ctx.dtype(node.inputs[1])
    return [ctx.cast(y, scale_dtype)]


@onnx_op("QLinearMatMul")
def qlinear_matmul(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    from edgerun.frontends.onnx.nn import matmul_nd
    a = dequantize(ctx, node, ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2))
    b = dequantize(ctx, node, ctx.input(node, 3), ctx.input(node, 4), ctx.input(node, 5))
    y = matmul_nd(ctx, a, b)
    return [quantize(ctx, node, y, ctx.input(node, 6), ctx.input(node, 7), ctx.dtype(node.inputs[7]))]


@onnx_op("MatMulInteger")
def matmul_integer(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    from edgerun.frontends.onnx.nn import matmul_nd
    a, b = ctx.cast(ctx.input(node, 0), DType.int32), ctx.cast(ctx.input(node, 1), DType.int32)
    if node.has_input(2):
        a = ctx.emit("sub", [a, ctx.cast(ctx.input(node, 2), DType.int32)])
    if node.has_input(3):
        zb = ctx.cast(ctx.input(node, 3), DType.int32)
        if len(ctx.b.shape(zb)) == 1 and ctx.b.shape(zb)[0] > 1:
            zb = ctx.emit("reshape", [zb], shape=[1, ctx.b.shape(zb)[0]])
        b = ctx.emit("sub", [b, zb])
    return [matmul_nd(ctx, a, b)]


@onnx_op("ConvInteger")
def conv_integer(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # Our conv is float-only; float32 holds every partial sum exactly while it stays below 2^24, which the
    # 8-bit operand ranges bound statically. Larger windows are refused rather than rounded.
    from edgerun.frontends.onnx.conv_pool import conv_values
    x, w = ctx.input(node, 0), ctx.input(node, 1)
    wshape = ctx.b.shape(w)
    window = int(np.prod(wshape[1:]))
    if window * 255 * 255 >= 2 ** 24:
        raise node.refuse(f"a window of {window} products could exceed float32's exact integer range")
    xf, wf = ctx.cast(x, DType.float32), ctx.cast(w, DType.float32)
    if node.has_input(2):
        xf = ctx.emit("sub", [xf, ctx.cast(ctx.input(node, 2), DType.float32)])
    if node.has_input(3):
        zw = ctx.cast(ctx.input(node, 3), DType.float32)
        if ctx.b.spec(zw).numel > 1:
            zw = ctx.emit("reshape", [zw], shape=[wshape[0]] + [1] * (len(wshape) - 1))
        wf = ctx.emit("sub", [wf, zw])
    return [ctx.cast(conv_values(ctx, node, xf, wf, ""), DType.int32)]
