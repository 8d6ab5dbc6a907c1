"""Trigonometric and hyperbolic ONNX ops without an atomic counterpart, composed from exp, log, sqrt, div.

atan uses the Cephes single-precision range reduction and polynomial (|error| < 2 ulp on float32); asin and
acos follow from it. These are written for float32 and float16 inputs; float64 ones are refused.
"""

from __future__ import annotations

import math

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType


# Inverse hyperbolic and hyperbolic functions compose exactly enough from exp, log and sqrt in fp32 for
# the moderate ranges these ops see; asin/acos/atan have no such form and are refused.
@onnx_op("Sinh", "Cosh", "Tan", "Asinh", "Acosh", "Atanh")
def trig_composite(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    op = node.op_type

    def s(v: float) -> str:
        return ctx.scalar(v, x)
    if op in ("Sinh", "Cosh"):
        e, em = ctx.emit("exp", [x]), ctx.emit("exp", [ctx.emit("neg", [x])])
        comb = ctx.emit("sub" if op == "Sinh" else "add", [e, em])
        return [ctx.emit("mul", [comb, s(0.5)])]
    if op == "Tan":
        return [ctx.emit("div", [ctx.emit("sin", [x]), ctx.emit("cos", [x])])]
    sq = ctx.emit("mul", [x, x])
    if op == "Asinh":
        return [ctx.emit("log", [ctx.emit("add", [x, ctx.emit("sqrt", [ctx.emit("add", [sq, s(1.0)])])])])]
    if op == "Acosh":
        return [ctx.emit("log", [ctx.emit("add", [x, ctx.emit("sqrt", [ctx.emit("sub", [sq, s(1.0)])])])])]
    ratio = ctx.emit("div", [ctx.emit("add", [s(1.0), x]), ctx.emit("sub", [s(1.0), x])])
    return [ctx.emit("mul", [ctx.emit("log", [ratio]), s(0.5)])]


def atan(ctx: ImportContext, x: str) -> str:
    def s(v: float) -> str:
        return ctx.scalar(v, x)
    ax = ctx.emit("abs", [x])
    big = ctx.emit("gt", [ax, s(2.414213562373095)])
    mid = ctx.emit("gt", [ax, s(0.4142135623730950)])
    # Reduce |x| into [0, tan(pi/8)]: atan(t) = pi/2 + atan(-1/t) = pi/4 + atan((t-1)/(t+1)).
    safe = ctx.emit("maximum", [ax, s(1e-30)])
    r_big = ctx.emit("neg", [ctx.emit("div", [s(1.0), safe])])
    r_mid = ctx.emit("div", [ctx.emit("sub", [ax, s(1.0)]), ctx.emit("add", [ax, s(1.0)])])
    r = ctx.emit("where", [big, r_big, ctx.emit("where", [mid, r_mid, ax])])
    base = ctx.emit("where", [big, s(math.pi / 2), ctx.emit("where", [mid, s(math.pi / 4), s(0.0)])])
    z = ctx.emit("mul", [r, r])
    poly = s(8.05374449538e-2)
    for c in (-1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1):
        poly = ctx.emit("add", [ctx.emit("mul", [poly, z]), s(c)])
    y = ctx.emit("add", [ctx.emit("mul", [ctx.emit("mul", [poly, z]), r]), r])
    y = ctx.emit("add", [y, base])
    return ctx.emit("mul", [y, ctx.emit("sign", [x])])


@onnx_op("Atan", "Asin", "Acos")
def inverse_trig(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    if ctx.b.dtype(x) is DType.float64:  # the polynomial is accurate to float32 only: a float32 answer is wrong
        raise node.refuse(f"{node.op_type} of float64 (edgerun's atan is a single-precision polynomial)")
    if node.op_type == "Atan":
        return [atan(ctx, x)]
    one = ctx.scalar(1.0, x)
    if node.op_type == "Acos":
        # acos(x) = 2 atan(sqrt((1 - x) / (1 + x))): no cancellation near x = 1, and x = -1 gives pi.
        half_tan = ctx.emit("sqrt", [ctx.emit("div", [ctx.emit("sub", [one, x]), ctx.emit("add", [one, x])])])
        return [ctx.emit("mul", [atan(ctx, half_tan), ctx.scalar(2.0, x)])]
    # asin(x) = atan2(x, sqrt(1 - x^2)), written with atan on the ratio and the |x| = 1 ends kept exact.
    root = ctx.emit("sqrt", [ctx.emit("mul", [ctx.emit("sub", [one, x]), ctx.emit("add", [one, x])])])
    ratio = ctx.emit("div", [x, ctx.emit("maximum", [root, ctx.scalar(1e-30, x)])])
    asin = ctx.emit("where", [ctx.emit("eq", [ctx.emit("abs", [x]), one]),
                              ctx.emit("mul", [ctx.emit("sign", [x]), ctx.scalar(math.pi / 2, x)]), atan(ctx, ratio)])
    return [asin]
