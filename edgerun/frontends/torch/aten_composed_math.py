"""Handlers for ATen math ops written with other IR ops: tan, erfc, hypot, fmax, fmin (found missing by the
OpInfo sweep, bench/torch_opdb.py --sweep).

tan is sin / cos; erfc is 1 - erf (absolute error ~1e-7, so far in the tail the relative error grows);
hypot is sqrt(a^2 + b^2); fmax/fmin take the other operand where one is NaN (NaN only when both are), unlike
maximum/minimum, which propagate NaN.
"""

from __future__ import annotations

from typing import Any

from edgerun.frontends.torch.context import ConvertContext, handles


def _float_operands(ctx: ConvertContext, node: Any, count: int) -> list[str]:
    dtype = ctx.out_dtype(node)
    if not dtype.is_float:
        ctx.unsupported(f"{node.target} of integers")
    return [ctx.operand(node.args[i], dtype) for i in range(count)]


@handles("aten.tan.default")
def _tan(ctx: ConvertContext, node: Any) -> str:
    (x,) = _float_operands(ctx, node, 1)
    return ctx.b.binary("div", ctx.b.unary("sin", x), ctx.b.unary("cos", x))


@handles("aten.erfc.default")
def _erfc(ctx: ConvertContext, node: Any) -> str:
    (x,) = _float_operands(ctx, node, 1)
    return ctx.b.binary("sub", ctx.b.scalar(1.0, x), ctx.b.unary("erf", x))


@handles("aten.hypot.default")
def _hypot(ctx: ConvertContext, node: Any) -> str:
    a, b = _float_operands(ctx, node, 2)
    bb = ctx.b
    return bb.unary("sqrt", bb.binary("add", bb.binary("mul", a, a), bb.binary("mul", b, b)))


@handles("aten.fmax.default", "aten.fmin.default")
def _fmax_fmin(ctx: ConvertContext, node: Any) -> str:
    dtype = ctx.out_dtype(node)
    a, b = (ctx.operand(node.args[i], dtype) for i in range(2))
    bb = ctx.b
    both = bb.binary("maximum" if "fmax" in str(node.target) else "minimum", a, b)
    if not dtype.is_float:
        return both
    a_nan, b_nan = bb.binary("ne", a, a), bb.binary("ne", b, b)
    return bb.emit("where", [a_nan, b, bb.emit("where", [b_nan, a, both])])
