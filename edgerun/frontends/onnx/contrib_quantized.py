"""ONNX Runtime's quantized contrib ops (domain com.microsoft), as its quantizer and graph optimizer emit them:

- MatMulIntegerToFloat: (A - a_zp) @ (B - b_zp) exactly in int32, times a_scale * b_scale, plus bias.
- DynamicQuantizeMatMul: A quantized to uint8 at run time (DynamicQuantizeLinear's scale and zero point),
  then as MatMulIntegerToFloat against the 8-bit weight.
- QGemm: Gemm of two 8-bit operands with an int32 bias, requantized to y_scale/y_zp (or float without them).
- QLinearAdd: the IR's quantized_add (ORT's own arithmetic, bit for bit); broadcast operands are expanded.
- QLinearGlobalAveragePool: the sum over each channel's image minus its zero points, requantized by
  x_scale / (y_scale * size), as ORT's MLAS kernel computes it (float32 epilogue).

All are the IR's quantized ops (matmul_integer, dynamic_quantize, requantize, quantized_add): no new op.
Semantics from ORT's ContribOperators.md; tests/onnx/test_onnx_contrib_ops.py compares with ORT's kernels.
"""

from __future__ import annotations

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.nn import matmul_nd
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType
from edgerun.ir.ops._rules import broadcast_shapes


def _zp(ctx: ImportContext, node: OnnxNode, i: int, like: str) -> str:
    """Optional zero point input i (a zero of the data's type when absent); per-tensor ones as 0-d."""
    zp = ctx.input(node, i) if node.has_input(i) else ctx.b.const(np.zeros((), ctx.b.dtype(like).np))
    return ctx.emit("reshape", [zp], shape=[]) if ctx.b.spec(zp).numel == 1 and ctx.b.shape(zp) else zp


def _f32(ctx: ImportContext, v: str) -> str:
    return ctx.cast(v, DType.float32)


def _scaled(ctx: ImportContext, acc: str, a_scale: str, b_scale: str, bias: str | None) -> str:
    """float32(acc) * (a_scale * b_scale) + bias: ORT's scale-and-bias epilogue."""
    scale = ctx.emit("mul", [_f32(ctx, a_scale), _f32(ctx, b_scale)])
    y = ctx.emit("mul", [ctx.cast(acc, DType.float32), scale])
    return ctx.emit("add", [y, bias]) if bias else y


def _integer_matmul(ctx: ImportContext, node: OnnxNode, a: str, b: str, a_zp: str, b_zp: str) -> str:
    if ctx.b.spec(a_zp).numel > 1:
        raise node.refuse("a per-row zero point on input A")
    return matmul_nd(ctx, a, b, "matmul_integer", [a_zp, b_zp])


@onnx_op("com.microsoft:MatMulIntegerToFloat")
def matmul_integer_to_float(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    acc = _integer_matmul(ctx, node, a, b, _zp(ctx, node, 4, a), _zp(ctx, node, 5, b))
    return [_scaled(ctx, acc, ctx.input(node, 2), ctx.input(node, 3), ctx.input(node, 6) if node.has_input(6) else None)]


@onnx_op("com.microsoft:DynamicQuantizeMatMul")
def dynamic_quantize_matmul(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    b = ctx.input(node, 1)
    q, a_scale, a_zp = ctx.b.emit_multi("dynamic_quantize", [_f32(ctx, ctx.input(node, 0))], dtype="uint8")
    acc = _integer_matmul(ctx, node, q, b, a_zp, _zp(ctx, node, 3, b))
    return [_scaled(ctx, acc, a_scale, ctx.input(node, 2), ctx.input(node, 4) if node.has_input(4) else None)]


def _requantized(ctx: ImportContext, acc: str, multiplier: str, y_zp: str) -> str:
    return ctx.emit("requantize", [acc, multiplier, y_zp], arithmetic="float32")


@onnx_op("com.microsoft:QGemm")
def qgemm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    a, b = ctx.input(node, 0), ctx.input(node, 3)
    if node.attr("transA", 0):
        a = ctx.emit("transpose", [a], perm=[1, 0])
    if node.attr("transB", 0):
        b = ctx.emit("transpose", [b], perm=[1, 0])
    acc = _integer_matmul(ctx, node, a, b, _zp(ctx, node, 2, a), _zp(ctx, node, 5, b))
    if node.has_input(6):
        acc = ctx.emit("add", [acc, ctx.cast(ctx.input(node, 6), DType.int32)])
    alpha = node.float_attr("alpha", 1.0)
    scale = ctx.emit("mul", [_f32(ctx, ctx.input(node, 1)), _f32(ctx, ctx.input(node, 4))])
    if alpha != 1.0:
        scale = ctx.emit("mul", [ctx.scalar(alpha, scale), scale])
    if not node.has_input(7):  # no output scale: float output
        return [ctx.emit("mul", [ctx.cast(acc, DType.float32), scale])]
    multiplier = ctx.emit("div", [scale, _f32(ctx, ctx.input(node, 7))])
    if ctx.b.shape(multiplier) and ctx.b.spec(multiplier).numel == 1:
        multiplier = ctx.emit("reshape", [multiplier], shape=[])
    return [_requantized(ctx, acc, multiplier, _zp(ctx, node, 8, ctx.input(node, 0)))]


def _scalar(ctx: ImportContext, v: str) -> str:
    return ctx.emit("reshape", [v], shape=[]) if ctx.b.shape(v) else v


@onnx_op("com.microsoft:QLinearAdd")
def qlinear_add(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    a, b = ctx.input(node, 0), ctx.input(node, 3)
    params = [_scalar(ctx, _f32(ctx, ctx.input(node, i))) if i in (1, 4, 6) else _zp(ctx, node, i, a)
              for i in (1, 2, 4, 5, 6, 7)]
    if any(ctx.b.shape(p) for p in params):
        raise node.refuse("per-channel scales or zero points")
    shape = ctx.b.shape(a) if ctx.b.shape(a) == ctx.b.shape(b) else None
    if shape is None:
        shape = broadcast_shapes(ctx.b.shape(a), ctx.b.shape(b))
        a, b = (x if ctx.b.shape(x) == shape else ctx.emit("expand", [x], shape=list(shape)) for x in (a, b))
    a_scale, a_zp, b_scale, b_zp, y_scale, y_zp = params
    return [ctx.emit("quantized_add", [a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp])]


@onnx_op("com.microsoft:QLinearGlobalAveragePool")
def qlinear_global_average_pool(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    shape = ctx.b.shape(x)
    channels_last = bool(node.attr("channels_last", 0))
    axes = list(range(1, len(shape) - 1)) if channels_last else list(range(2, len(shape)))
    size = 1
    for ax in axes:
        size = size * shape[ax]
    if not isinstance(size, int):
        raise node.refuse("a symbolic image size")
    x_zp = _zp(ctx, node, 2, x)
    centred = ctx.emit("sub", [ctx.cast(x, DType.int32), ctx.cast(x_zp, DType.int32)])
    acc = ctx.emit("reduce_sum", [centred], axes=axes, keepdims=True)
    # MLAS: ScaleInput / (ScaleOutput * ImageSize), each step rounded to float32.
    denominator = ctx.emit("mul", [_scalar(ctx, _f32(ctx, ctx.input(node, 3))), ctx.b.const(np.float32(size))])
    multiplier = ctx.emit("div", [_scalar(ctx, _f32(ctx, ctx.input(node, 1))), denominator])
    return [_requantized(ctx, acc, multiplier, _zp(ctx, node, 4, x))]
