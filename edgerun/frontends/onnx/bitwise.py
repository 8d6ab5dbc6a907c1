"""Bitwise ONNX ops on 8-, 16- and 32-bit integers, from exact int64 arithmetic (there is no bitwise primitive).

Each operand is read as its unsigned bit pattern, split into bits with floor-division and modulo, combined
bit by bit, and mapped back to the signed range. int64 and uint64 And/Or/Xor are refused (no wider type to
work in). BitCast reads the same bytes as another type: the IR's `bitcast` (numpy's view), which no
arithmetic can express (NaN payloads, -0.0).
"""

from __future__ import annotations

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out, onnx_dtype
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType

# The types whose bit patterns fit in int64 with room for the arithmetic below.
WIDENABLE = (DType.int8, DType.uint8, DType.int16, DType.uint16, DType.int32, DType.uint32)


@onnx_op("BitwiseNot")
def bitwise_not(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    dtype = ctx.b.dtype(x)
    if dtype is DType.bool or dtype.is_float:
        raise node.refuse(f"BitwiseNot of {dtype.value}")
    # ~x = -1 - x for two's complement, (2^w - 1) - x for unsigned; neither can overflow.
    top = -1 if dtype.is_signed_int else 2 ** (dtype.itemsize * 8) - 1
    return [ctx.emit("sub", [ctx.scalar(top, x), x])]


@onnx_op("BitwiseAnd", "BitwiseOr", "BitwiseXor")
def bitwise_binary(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    dtype = ctx.b.dtype(a)
    if dtype not in WIDENABLE:
        raise node.refuse(f"{node.op_type} of {dtype.value}")
    width = dtype.itemsize * 8
    modulus = 2 ** width

    def unsigned(v: str) -> str:
        return ctx.emit("mod", [ctx.cast(v, DType.int64), ctx.b.const(np.int64(modulus))])
    ua, ub = unsigned(a), unsigned(b)
    total = ""
    for k in range(width):
        scale = ctx.scalar(2 ** k, ua)
        two = ctx.scalar(2, ua)
        bit_a = ctx.emit("mod", [ctx.emit("div", [ua, scale], rounding="floor"), two])
        bit_b = ctx.emit("mod", [ctx.emit("div", [ub, scale], rounding="floor"), two])
        both = ctx.emit("mul", [bit_a, bit_b])
        if node.op_type == "BitwiseAnd":
            bit = both
        else:
            either = ctx.emit("add", [bit_a, bit_b])
            bit = ctx.emit("sub", [either, both if node.op_type == "BitwiseOr" else ctx.emit("mul", [both, two])])
        term = ctx.emit("mul", [bit, scale])
        total = ctx.emit("add", [total, term]) if total else term
    if dtype.is_signed_int:
        wrapped = ctx.emit("sub", [total, ctx.scalar(modulus, total)])
        total = ctx.emit("where", [ctx.emit("ge", [total, ctx.scalar(modulus // 2, total)]), wrapped, total])
    return [ctx.cast(total, dtype)]


@onnx_op("BitCast")
def bit_cast(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """The same bytes read as attr `to` (numpy's view): the IR's bitcast, same-width types only."""
    x = ctx.input(node, 0)
    to = onnx_dtype(int(node.attr("to")), f"{node.op_type} to")
    src = ctx.b.dtype(x)
    if src.is_narrow or to.is_narrow or src.itemsize != to.itemsize:
        raise node.refuse(f"BitCast from {src.value} to {to.value} (the widths must match; narrow types are held "
                          "one per byte)")
    return [ctx.emit("bitcast", [x], dtype=to.value)]
