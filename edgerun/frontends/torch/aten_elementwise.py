"""Handlers for elementwise ATen ops: unary math, activations, arithmetic, comparisons, logic, where.

Every handler computes in torch's promoted dtype (from the exported graph's fake tensors), casting inputs
first, because our binary ops need operands of one dtype.
"""

from __future__ import annotations

import math
from typing import Any

from edgerun.frontends.torch.context import ConvertContext, handles
from edgerun.ir.dtypes import DType

# ---- unary -------------------------------------------------------------------------------------------

_UNARY_ATOMIC = {
    "exp": "exp", "log": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "tanh": "tanh", "sigmoid": "sigmoid",
    "erf": "erf", "sin": "sin", "cos": "cos", "neg": "neg", "abs": "abs", "sign": "sign",
    "reciprocal": "reciprocal", "relu": "relu", "silu": "silu", "hardswish": "hardswish",
    "hardsigmoid": "hardsigmoid",
}
_ROUNDING = {"floor": "floor", "ceil": "ceil", "round": "round"}


def _unary_input(ctx: ConvertContext, node: Any) -> tuple[str, DType]:
    out = ctx.out_dtype(node)
    if out is DType.bool:
        ctx.unsupported("boolean input")
    return ctx.operand(node.args[0], out), out


def _unary_handler(ir_op: str) -> Any:
    def handler(ctx: ConvertContext, node: Any) -> str:
        x, _ = _unary_input(ctx, node)
        return ctx.b.unary(ir_op, x)
    return handler


for _aten, _ir in _UNARY_ATOMIC.items():
    handles(f"aten.{_aten}.default")(_unary_handler(_ir))


def _rounding_handler(ir_op: str) -> Any:
    def handler(ctx: ConvertContext, node: Any) -> str:
        x, dtype = _unary_input(ctx, node)
        return ctx.b.unary(ir_op, x) if dtype.is_float else x  # integers are already whole
    return handler


for _aten, _ir in _ROUNDING.items():
    handles(f"aten.{_aten}.default")(_rounding_handler(_ir))


@handles("aten.round.decimals")
def _round_decimals(ctx: ConvertContext, node: Any) -> str:
    x, dtype = _unary_input(ctx, node)
    decimals = int(ctx.bind(node)["decimals"])
    if not dtype.is_float:
        ctx.unsupported("round with decimals on integers")
    if decimals == 0:
        return ctx.b.unary("round", x)
    ctx.unsupported("round with decimals != 0 (scaling by 10**decimals does not round like torch)")


@handles("aten.trunc.default")
def _trunc(ctx: ConvertContext, node: Any) -> str:
    x, dtype = _unary_input(ctx, node)
    if not dtype.is_float:
        return x
    b = ctx.b
    return b.emit("where", [b.binary("ge", x, b.scalar(0, x)), b.unary("floor", x), b.unary("ceil", x)])


@handles("aten.frac.default")
def _frac(ctx: ConvertContext, node: Any) -> str:
    x, _ = _unary_input(ctx, node)
    b = ctx.b
    whole = b.emit("where", [b.binary("ge", x, b.scalar(0, x)), b.unary("floor", x), b.unary("ceil", x)])
    return b.binary("sub", x, whole)


@handles("aten.expm1.default")
def _expm1(ctx: ConvertContext, node: Any) -> str:
    x, _ = _unary_input(ctx, node)
    return ctx.b.binary("sub", ctx.b.unary("exp", x), ctx.b.scalar(1, x))


@handles("aten.log1p.default")
def _log1p(ctx: ConvertContext, node: Any) -> str:
    x, _ = _unary_input(ctx, node)
    return ctx.b.unary("log", ctx.b.binary("add", x, ctx.b.scalar(1, x)))


def _scaled_log(factor: float) -> Any:
    def handler(ctx: ConvertContext, node: Any) -> str:
        x, _ = _unary_input(ctx, node)
        return ctx.b.binary("mul", ctx.b.unary("log", x), ctx.b.scalar(factor, x))
    return handler


handles("aten.log2.default")(_scaled_log(1 / math.log(2)))
handles("aten.log10.default")(_scaled_log(1 / math.log(10)))


@handles("aten.exp2.default")
def _exp2(ctx: ConvertContext, node: Any) -> str:
    x, _ = _unary_input(ctx, node)
    return ctx.b.unary("exp", ctx.b.binary("mul", x, ctx.b.scalar(math.log(2), x)))


@handles("aten.sinh.default", "aten.cosh.default")
def _sinh_cosh(ctx: ConvertContext, node: Any) -> str:
    x, _ = _unary_input(ctx, node)
    b = ctx.b
    op = "sub" if "sinh" in str(node.target) else "add"
    both = b.binary(op, b.unary("exp", x), b.unary("exp", b.unary("neg", x)))
    return b.binary("mul", both, b.scalar(0.5, x))


@handles("aten.gelu.default")
def _gelu(ctx: ConvertContext, node: Any) -> str:
    x, _ = _unary_input(ctx, node)
    return ctx.b.emit("gelu", [x], approximate=str(ctx.bind(node)["approximate"]))


@handles("aten.leaky_relu.default")
def _leaky_relu(ctx: ConvertContext, node: Any) -> str:
    x, _ = _unary_input(ctx, node)
    return ctx.b.emit("leaky_relu", [x], alpha=float(ctx.bind(node)["negative_slope"]))


@handles("aten.elu.default")
def _elu(ctx: ConvertContext, node: Any) -> str:
    x, _ = _unary_input(ctx, node)
    a = ctx.bind(node)
    alpha, scale, in_scale = float(a["alpha"]), float(a["scale"]), float(a["input_scale"])
    b = ctx.b
    neg = b.binary("mul", b.binary("sub", b.unary("exp", b.binary("mul", x, b.scalar(in_scale, x))),
                                   b.scalar(1, x)), b.scalar(alpha * scale, x))
    pos = b.binary("mul", x, b.scalar(scale, x))
    return b.emit("where", [b.binary("gt", x, b.scalar(0, x)), pos, neg])


@handles("aten.hardtanh.default")
def _hardtanh(ctx: ConvertContext, node: Any) -> str:
    x, _ = _unary_input(ctx, node)
    a = ctx.bind(node)
    return ctx.b.emit("clamp", [x], min=float(a["min_val"]), max=float(a["max_val"]))


@handles("aten.clamp.default")
def _clamp(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    if dtype is DType.bool:
        ctx.unsupported("clamp of a boolean tensor")
    x = ctx.operand(a["self"], dtype)
    b = ctx.b
    # Applied as two binary ops with torch's order (max first, then min) so min > max gives max.
    if a["min"] is not None:
        x = b.binary("maximum", x, ctx.operand(a["min"], dtype))
    if a["max"] is not None:
        x = b.binary("minimum", x, ctx.operand(a["max"], dtype))
    return x


@handles("aten.clamp.Tensor", "aten.clamp_min.default", "aten.clamp_max.default",
         "aten.clamp_min.Tensor", "aten.clamp_max.Tensor")
def _clamp_tensor(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    lo = a.get("min")
    hi = a.get("max")
    dtype = ctx.out_dtype(node)
    if dtype is DType.bool:
        ctx.unsupported("clamp of a boolean tensor")
    x = ctx.operand(a["self"], dtype)
    if lo is not None:
        x = ctx.b.binary("maximum", x, ctx.operand(lo, dtype))
    if hi is not None:
        x = ctx.b.binary("minimum", x, ctx.operand(hi, dtype))
    out_shape = ctx.out_shape(node)
    if ctx.b.shape(x) != out_shape:
        x = ctx.b.emit("expand", [x], shape=list(out_shape))
    return x


@handles("aten.threshold.default")
def _threshold(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    x = ctx.operand(a["self"], dtype)
    return ctx.b.emit("where", [ctx.b.binary("gt", x, ctx.operand(a["threshold"], dtype)), x,
                                ctx.operand(a["value"], dtype)])


@handles("aten.logical_not.default")
def _logical_not(ctx: ConvertContext, node: Any) -> str:
    return ctx.b.unary("logical_not", _as_bool(ctx, node.args[0]))


@handles("aten.bitwise_not.default")
def _bitwise_not(ctx: ConvertContext, node: Any) -> str:
    if ctx.out_dtype(node) is not DType.bool:
        ctx.unsupported("bitwise_not on integers (only booleans are supported)")
    return ctx.b.unary("logical_not", ctx.v(node.args[0]))


@handles("aten.isnan.default")
def _isnan(ctx: ConvertContext, node: Any) -> str:
    x = ctx.v(node.args[0])
    if not ctx.b.dtype(x).is_float:
        return ctx.b.const(__import__("numpy").zeros(ctx.b.shape(x), bool))
    return ctx.b.binary("ne", x, x)


@handles("aten.isinf.default")
def _isinf(ctx: ConvertContext, node: Any) -> str:
    x = ctx.v(node.args[0])
    if not ctx.b.dtype(x).is_float:
        return ctx.b.const(__import__("numpy").zeros(ctx.b.shape(x), bool))
    return ctx.b.binary("eq", ctx.b.unary("abs", x), ctx.b.scalar(math.inf, x))


def _as_bool(ctx: ConvertContext, arg: Any) -> str:
    if ctx.is_tensor(arg):
        x = ctx.v(arg)
        if ctx.b.dtype(x) is DType.bool:
            return x
        return ctx.b.binary("ne", x, ctx.b.scalar(0, x))
    return ctx.b.const(__import__("numpy").asarray(bool(arg)))


# ---- binary arithmetic -------------------------------------------------------------------------------

def _operands(ctx: ConvertContext, node: Any, dtype: DType) -> tuple[str, str]:
    a = ctx.bind(node)
    names = [n for n in ("self", "other", "exponent") if n in a]
    return ctx.operand(a[names[0]], dtype), ctx.operand(a[names[1]], dtype)


def _with_alpha(ctx: ConvertContext, node: Any, y: str, dtype: DType) -> str:
    alpha = ctx.bind(node).get("alpha", 1)
    if alpha is None or alpha == 1:
        return y
    return ctx.b.binary("mul", y, ctx.operand(alpha, dtype))


def _arith_handler(ir_op: str, alpha: bool = False) -> Any:
    def handler(ctx: ConvertContext, node: Any) -> str:
        dtype = ctx.out_dtype(node)
        x, y = _operands(ctx, node, dtype)
        if alpha:
            y = _with_alpha(ctx, node, y, dtype)
        if dtype is DType.bool and ir_op in ("add", "sub", "mul", "maximum", "minimum"):
            return ctx.b.binary({"add": "logical_or", "mul": "logical_and", "maximum": "logical_or",
                                 "minimum": "logical_and"}.get(ir_op) or ctx.unsupported("bool subtraction"),
                                x, y)
        return ctx.b.binary(ir_op, x, y)
    return handler


for _aten in ("add.Tensor", "add.Scalar"):
    handles(f"aten.{_aten}")(_arith_handler("add", alpha=True))
for _aten in ("sub.Tensor", "sub.Scalar"):
    handles(f"aten.{_aten}")(_arith_handler("sub", alpha=True))
for _aten in ("mul.Tensor", "mul.Scalar"):
    handles(f"aten.{_aten}")(_arith_handler("mul"))
handles("aten.maximum.default")(_arith_handler("maximum"))
handles("aten.minimum.default")(_arith_handler("minimum"))


@handles("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(ctx: ConvertContext, node: Any) -> str:
    dtype = ctx.out_dtype(node)
    x, y = _operands(ctx, node, dtype)
    return ctx.b.binary("sub", y, _with_alpha(ctx, node, x, dtype))


@handles("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div(ctx: ConvertContext, node: Any) -> str:
    dtype = ctx.out_dtype(node)
    mode = ctx.bind(node).get("rounding_mode")
    x, y = _operands(ctx, node, dtype)
    if dtype is DType.bool:
        ctx.unsupported("boolean division")
    if mode is None and not dtype.is_float:
        ctx.unsupported("true division producing integers")
    return ctx.b.emit("div", [x, y], rounding=mode or "none")


@handles("aten.floor_divide.default")
def _floor_divide(ctx: ConvertContext, node: Any) -> str:
    dtype = ctx.out_dtype(node)
    x, y = _operands(ctx, node, dtype)
    return ctx.b.emit("div", [x, y], rounding="floor")


@handles("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.fmod.Tensor", "aten.fmod.Scalar")
def _mod(ctx: ConvertContext, node: Any) -> str:
    dtype = ctx.out_dtype(node)
    if dtype is DType.bool:
        ctx.unsupported("boolean remainder")
    x, y = _operands(ctx, node, dtype)
    return ctx.b.emit("mod", [x, y], fmod="fmod" in str(node.target))


@handles("aten.pow.Tensor_Tensor", "aten.pow.Tensor_Scalar", "aten.pow.Scalar")
def _pow(ctx: ConvertContext, node: Any) -> str:
    dtype = ctx.out_dtype(node)
    if dtype is DType.bool:
        ctx.unsupported("boolean power")
    a = ctx.bind(node)
    base, exponent = ctx.operand(a["self"], dtype), ctx.operand(a["exponent"], dtype)
    if not ctx.is_tensor(a["exponent"]) and a["exponent"] == 2:
        return ctx.b.binary("mul", base, base)  # exact, and what torch's kernel special-cases too
    return ctx.b.binary("pow", base, exponent)


@handles("aten.square.default")
def _square(ctx: ConvertContext, node: Any) -> str:
    x = ctx.operand(node.args[0], ctx.out_dtype(node))
    return ctx.b.binary("mul", x, x)


# ---- comparisons and logic ---------------------------------------------------------------------------

_COMPARE = ("eq", "ne", "lt", "le", "gt", "ge")


def _compare_handler(ir_op: str) -> Any:
    def handler(ctx: ConvertContext, node: Any) -> str:
        a = ctx.bind(node)
        dtype = ctx.result_type(a["self"], a["other"])
        x, y = ctx.operand(a["self"], dtype), ctx.operand(a["other"], dtype)
        if dtype is DType.bool and ir_op not in ("eq", "ne"):
            x, y = ctx.cast(x, DType.int32), ctx.cast(y, DType.int32)
        return ctx.b.binary(ir_op, x, y)
    return handler


for _c in _COMPARE:
    handles(f"aten.{_c}.Tensor", f"aten.{_c}.Scalar")(_compare_handler(_c))


def _logical_handler(ir_op: str, bool_only: bool) -> Any:
    def handler(ctx: ConvertContext, node: Any) -> str:
        if bool_only and ctx.out_dtype(node) is not DType.bool:
            ctx.unsupported("bitwise ops on integers (only booleans are supported)")
        a = ctx.bind(node)
        return ctx.b.binary(ir_op, _as_bool(ctx, a["self"]), _as_bool(ctx, a["other"]))
    return handler


for _l in ("and", "or", "xor"):
    handles(f"aten.logical_{_l}.default")(_logical_handler(f"logical_{_l}", False))
    handles(f"aten.bitwise_{_l}.Tensor", f"aten.bitwise_{_l}.Scalar")(_logical_handler(f"logical_{_l}", True))


@handles("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    cond = _as_bool(ctx, a["condition"])
    out = ctx.b.emit("where", [cond, ctx.operand(a["self"], dtype), ctx.operand(a["other"], dtype)])
    return out


@handles("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    x = ctx.operand(a["self"], dtype)
    out = ctx.b.emit("where", [_as_bool(ctx, a["mask"]), ctx.operand(a["value"], dtype), x])
    if ctx.b.shape(out) != ctx.b.shape(x):
        ctx.unsupported("masked_fill whose mask broadcasts the input")
    return out
