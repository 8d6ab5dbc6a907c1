"""ONNX's quantized ops, imported into edgerun's quantized IR with their exact integer semantics.

QDQ models (QuantizeLinear / DequantizeLinear around float ops), QOperator models (QLinearConv,
QLinearMatMul), ONNX Runtime's dynamic quantization (DynamicQuantizeLinear, MatMulInteger, ConvInteger)
and its weight-only int4 MatMulNBits (domain com.microsoft). Per-axis scales and zero points become
broadcastable operands (a [C] vector reshaped to [C, 1, 1] for axis 1 of NCHW); a missing zero point is a
zero of the type the spec names. Block-wise QuantizeLinear/DequantizeLinear (opset 21) is refused.
"""

from __future__ import annotations

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out, onnx_dtype
from edgerun.frontends.onnx.nn import matmul_nd
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType
from edgerun.oracle.quant_kernels import unpack_int4


def _along(ctx: ImportContext, node: OnnxNode, v: str, rank: int, axis: int) -> str:
    """A per-axis 1-D parameter reshaped to broadcast along `axis` of a rank-`rank` tensor."""
    shape = ctx.b.shape(v)
    if node.attr("block_size", 0):
        return _blocked(ctx, node, v, axis % rank, int(node.attr("block_size")))
    if len(shape) == 0 or (len(shape) == 1 and shape[0] == 1):
        return ctx.emit("reshape", [v], shape=[]) if shape else v
    if len(shape) != 1:
        raise node.refuse(f"a scale of shape {shape} without block_size (per-tensor, per-axis or blocked)")
    view = [1] * (rank - axis % rank)
    view[0] = shape[0]
    return ctx.emit("reshape", [v], shape=view)


def _blocked(ctx: ImportContext, node: OnnxNode, v: str, axis: int, block: int) -> str:
    """A block-wise parameter (the input's shape, ceil(extent / block) along `axis`) repeated block times
    along `axis` and cut to the input's extent: one value per element, which broadcasts trivially."""
    shape = list(ctx.b.shape(v))
    full = list(ctx.shape(node.inputs[0]))
    if len(shape) != len(full) or not all(isinstance(d, int) for d in (*shape, *full)) or \
            shape[axis] != -(-full[axis] // block) or any(s != f for i, (s, f) in enumerate(zip(shape, full))
                                                          if i != axis):
        raise node.refuse(f"block-wise parameter of shape {tuple(shape)} for an input {tuple(full)} with "
                          f"block_size {block} along axis {axis}")
    one = ctx.emit("reshape", [v], shape=[*shape[:axis + 1], 1, *shape[axis + 1:]])
    rep = one if block == 1 else ctx.emit("concat", [one] * block, axis=axis + 1)
    flat = ctx.emit("reshape", [rep], shape=[*shape[:axis], shape[axis] * block, *shape[axis + 1:]])
    return flat if shape[axis] * block == full[axis] else \
        ctx.emit("slice", [flat], starts=[0], ends=[full[axis]], axes=[axis])


def _zero_point(ctx: ImportContext, node: OnnxNode, i: int, dtype: DType, like: str) -> str:
    """Input i, or a zero of `dtype` shaped like the scale `like` when the optional input is absent."""
    if node.has_input(i):
        return ctx.input(node, i)
    return ctx.b.const(np.zeros(ctx.b.shape(like), dtype.np))


def _f32(ctx: ImportContext, v: str) -> str:
    return ctx.cast(v, DType.float32)


@onnx_op("QuantizeLinear")
def quantize_linear(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    if node.has_input(2):
        dtype = ctx.dtype(node.inputs[2])
    elif node.attr("output_dtype"):
        dtype = onnx_dtype(int(node.attr("output_dtype")), "QuantizeLinear output_dtype")
    else:
        dtype = DType.uint8
    if _lowered(dtype):
        return [_quantize_lowered(ctx, node, dtype)]
    if dtype not in (DType.int8, DType.uint8):
        raise node.refuse(f"quantization to {dtype.value} (int8, uint8, int16, uint16, float8, float4, int4/uint4 "
                          "and int2/uint2 are supported)")
    x = _f32(ctx, ctx.input(node, 0))
    rank, axis = len(ctx.b.shape(x)), int(node.attr("axis", 1))
    scale = _f32(ctx, ctx.input(node, 1))
    zp = _zero_point(ctx, node, 2, dtype, scale)
    return [ctx.emit("quantize_linear", [x, _along(ctx, node, scale, rank, axis), _along(ctx, node, zp, rank, axis)])]


@onnx_op("DequantizeLinear")
def dequantize_linear(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    q = ctx.input(node, 0)
    dtype = ctx.b.dtype(q)
    if _lowered(dtype):
        y = _dequantize_lowered(ctx, node, q)
    elif dtype in (DType.int8, DType.uint8, DType.int32):
        y = _dequantize_integer(ctx, node, q)
    else:
        raise node.refuse(f"dequantization of {dtype.value}")
    if node.attr("output_dtype"):
        return [ctx.cast(y, onnx_dtype(int(node.attr("output_dtype")), "DequantizeLinear output_dtype"))]
    return [ctx.cast(y, ctx.dtype(node.inputs[1]))]


def _dequantize_integer(ctx: ImportContext, node: OnnxNode, q: str) -> str:
    dtype = ctx.b.dtype(q)
    rank, axis = len(ctx.b.shape(q)), int(node.attr("axis", 1))
    scale_in = ctx.input(node, 1)
    scale = _f32(ctx, scale_in)
    zp = _zero_point(ctx, node, 2, dtype, scale)
    return ctx.emit("dequantize_linear", [q, _along(ctx, node, scale, rank, axis), _along(ctx, node, zp, rank, axis)])


# The narrow types (float8, float4, int4/uint4, int2/uint2) and int16/uint16 are lowered to float32 arithmetic
# and a Cast, as ONNX's reference computes them (exact: every such integer is a float32): the quantized IR ops
# stay int8/uint8/int32, the kernels the backends have.
_LOWERED_INT_RANGE = {DType.int4: (-8, 7), DType.uint4: (0, 15), DType.int2: (-2, 1), DType.uint2: (0, 3),
                      DType.int16: (-32768, 32767), DType.uint16: (0, 65535)}


def _lowered(dtype: DType) -> bool:
    return dtype in _LOWERED_INT_RANGE or dtype.is_float8 or dtype is DType.float4_e2m1fn


def _precision_is_f32(node: OnnxNode) -> None:
    if int(node.attr("precision", 0)) not in (0, 1):
        raise node.refuse("a precision other than float32 for a narrow type")


def _quantize_lowered(ctx: ImportContext, node: OnnxNode, dtype: DType) -> str:
    """int16/uint16/int4/uint4/int2/uint2: clip(round_half_even(x / scale) + zero_point); float8: x / scale cast with
    `saturate` (a float8 zero point must be 0, and ONNX ignores it); float4: x / scale + zero_point, cast."""
    _precision_is_f32(node)
    x = _f32(ctx, ctx.input(node, 0))
    rank, axis = len(ctx.b.shape(x)), int(node.attr("axis", 1))
    scaled = ctx.emit("div", [x, _along(ctx, node, _f32(ctx, ctx.input(node, 1)), rank, axis)])
    if dtype in _LOWERED_INT_RANGE:
        scaled = ctx.emit("round", [scaled])
    if node.has_input(2) and not dtype.is_float8:
        scaled = ctx.emit("add", [scaled, _along(ctx, node, _f32(ctx, ctx.input(node, 2)), rank, axis)])
    if dtype in _LOWERED_INT_RANGE:
        low, high = _LOWERED_INT_RANGE[dtype]
        scaled = ctx.emit("minimum", [ctx.emit("maximum", [scaled, ctx.scalar(low, scaled)]), ctx.scalar(high, scaled)])
    if dtype.is_float8 and not node.attr("saturate", 1):
        return ctx.emit("cast", [scaled], dtype=dtype.value, saturate=False)
    return ctx.cast(scaled, dtype)


def _dequantize_lowered(ctx: ImportContext, node: OnnxNode, q: str) -> str:
    """(float32(q) - float32(zero_point)) * scale; a float8 or float4 zero point is not subtracted (ONNX's
    reference ignores it; for float8 the spec requires it to be 0)."""
    dtype = ctx.b.dtype(q)
    rank, axis = len(ctx.b.shape(q)), int(node.attr("axis", 1))
    x = _f32(ctx, q)
    if node.has_input(2) and dtype in _LOWERED_INT_RANGE:
        x = ctx.emit("sub", [x, _along(ctx, node, _f32(ctx, ctx.input(node, 2)), rank, axis)])
    return ctx.emit("mul", [x, _along(ctx, node, _f32(ctx, ctx.input(node, 1)), rank, axis)])


def _matmul_integer_nd(ctx: ImportContext, node: OnnxNode, a: str, b: str, a_zp: str, b_zp: str) -> str:
    """matmul_integer with numpy's rules for 1-D operands; a per-row a_zp [M] and per-column b_zp [N]."""
    if ctx.b.spec(a_zp).numel > 1:
        a_zp = ctx.emit("reshape", [a_zp], shape=[ctx.b.spec(a_zp).numel, 1])
    return matmul_nd(ctx, a, b, "matmul_integer", [a_zp, b_zp])


@onnx_op("MatMulInteger")
def matmul_integer(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    a_zp = ctx.input(node, 2) or ctx.b.const(np.zeros((), ctx.b.dtype(a).np))
    b_zp = ctx.input(node, 3) or ctx.b.const(np.zeros((), ctx.b.dtype(b).np))
    return [_matmul_integer_nd(ctx, node, a, b, a_zp, b_zp)]


def _conv_integer(ctx: ImportContext, node: OnnxNode, x: str, w: str, x_zp: str, w_zp: str) -> str:
    from edgerun.frontends.onnx.conv_pool import conv_values
    if ctx.b.spec(x_zp).numel != 1:
        raise node.refuse("a per-channel input zero point")
    x_zp = ctx.emit("reshape", [x_zp], shape=[]) if ctx.b.shape(x_zp) else x_zp
    oc = ctx.b.shape(w)[0]
    w_zp = ctx.emit("reshape", [w_zp], shape=[oc, 1, 1, 1] if ctx.b.spec(w_zp).numel > 1 else [])
    return conv_values(ctx, node, x, w, "", zero_points=(x_zp, w_zp))


@onnx_op("ConvInteger")
def conv_integer(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x, w = ctx.input(node, 0), ctx.input(node, 1)
    x_zp = ctx.input(node, 2) or ctx.b.const(np.zeros((), ctx.b.dtype(x).np))
    w_zp = ctx.input(node, 3) or ctx.b.const(np.zeros((), ctx.b.dtype(w).np))
    return [_conv_integer(ctx, node, x, w, x_zp, w_zp)]


def _multiplier(ctx: ImportContext, in_scale: str, w_scale: str, out_scale: str, view: list[int] | None) -> str:
    """in_scale * w_scale / out_scale in float32 (ONNX Runtime's order), per-channel reshaped to `view`."""
    m = ctx.emit("div", [ctx.emit("mul", [_f32(ctx, in_scale), _f32(ctx, w_scale)]), _f32(ctx, out_scale)])
    if view is not None and ctx.b.spec(m).numel > 1:
        m = ctx.emit("reshape", [m], shape=view)
    elif ctx.b.shape(m):
        m = ctx.emit("reshape", [m], shape=[])
    return m


@onnx_op("QLinearConv")
def qlinear_conv(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale = (ctx.input(node, i) for i in range(7))
    y_zp = _zero_point(ctx, node, 7, DType.uint8, y_scale)
    acc = _conv_integer(ctx, node, x, w, x_zp, w_zp)
    rank, oc = len(ctx.b.shape(acc)), ctx.b.shape(w)[0]
    if node.has_input(8):
        bias = ctx.emit("reshape", [ctx.input(node, 8)], shape=[oc] + [1] * (rank - 2))
        acc = ctx.emit("add", [acc, bias])
    m = _multiplier(ctx, x_scale, w_scale, y_scale, [oc] + [1] * (rank - 2))
    if ctx.b.shape(y_zp):
        y_zp = ctx.emit("reshape", [y_zp], shape=[])
    return [ctx.emit("requantize", [acc, m, y_zp])]


@onnx_op("QLinearMatMul")
def qlinear_matmul(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale = (ctx.input(node, i) for i in range(7))
    y_zp = _zero_point(ctx, node, 7, DType.uint8, y_scale)
    if ctx.b.spec(a_scale).numel > 1:
        raise node.refuse("a per-row scale on input A")
    acc = _matmul_integer_nd(ctx, node, a, b, a_zp, b_zp)
    m = _multiplier(ctx, a_scale, b_scale, y_scale, [ctx.b.spec(b_scale).numel])
    if ctx.b.shape(y_zp):
        y_zp = ctx.emit("reshape", [y_zp], shape=[])
    return [ctx.emit("requantize", [acc, m, y_zp])]


@onnx_op("DynamicQuantizeLinear")
def dynamic_quantize_linear(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    q, scale, zp = ctx.b.emit_multi("dynamic_quantize", [_f32(ctx, ctx.input(node, 0))], dtype="uint8")
    return [q, scale, zp]


@onnx_op("com.microsoft:MatMulNBits")
def matmul_nbits(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    k, n, bits, group = (int(node.attr(a, d)) for a, d in (("K", 0), ("N", 0), ("bits", 4), ("block_size", 0)))
    if bits != 4:
        raise node.refuse(f"{bits}-bit weights (4-bit is supported)")
    if node.has_input(4):
        raise node.refuse("g_idx (act-order) weights")
    blocks = -(-k // group)
    a_in = ctx.input(node, 0)
    a = _f32(ctx, a_in)
    packed = ctx.emit("reshape", [ctx.input(node, 1)], shape=[n, blocks, group // 2])
    scales = ctx.emit("reshape", [_f32(ctx, ctx.input(node, 2))], shape=[n, blocks])
    ins = [a, packed, scales]
    if node.has_input(3):
        zp_const = ctx.static(node, 3, "zero point")
        assert zp_const is not None
        if zp_const.dtype == np.uint8:  # packed two per byte, each row padded to whole bytes
            zp_const = unpack_int4(zp_const.reshape(n, -1))[:, :blocks]
        ins.append(ctx.b.const(np.ascontiguousarray(zp_const.reshape(n, blocks).astype(
            np.uint8 if zp_const.dtype == np.uint8 else np.float32))))
    y = ctx.emit("matmul_int4", ins, k=k, n=n, group_size=group)
    if node.has_input(5):
        y = ctx.emit("add", [y, _f32(ctx, ctx.input(node, 5))])
    return [ctx.cast(y, ctx.b.dtype(a_in))]
