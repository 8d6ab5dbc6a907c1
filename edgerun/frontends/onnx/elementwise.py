"""Elementwise ONNX ops: unary math, binary arithmetic with broadcasting, comparisons, logic, casts."""

from __future__ import annotations

import numpy as np

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out, onnx_dtype
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import E8M0_ROUND_MODES, NARROW_NAMES, DType, narrow_cast

UNARY = {"Abs": "abs", "Neg": "neg", "Exp": "exp", "Log": "log", "Sqrt": "sqrt", "Tanh": "tanh",
         "Sigmoid": "sigmoid", "Erf": "erf", "Sin": "sin", "Cos": "cos", "Floor": "floor", "Ceil": "ceil",
         "Round": "round", "Sign": "sign", "Reciprocal": "reciprocal", "Not": "logical_not"}
BINARY = {"Add": "add", "Sub": "sub", "Mul": "mul", "And": "logical_and", "Or": "logical_or",
          "Xor": "logical_xor", "Equal": "eq", "Less": "lt", "Greater": "gt", "LessOrEqual": "le",
          "GreaterOrEqual": "ge"}
VARIADIC = {"Max": "maximum", "Min": "minimum", "Sum": "add"}


@onnx_op(*UNARY)
def unary(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [ctx.emit(UNARY[node.op_type], [ctx.input(node, 0)])]


@onnx_op(*BINARY)
def binary(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    if node.op_type == "Equal" and ctx.b.dtype(a) is DType.string:  # only the reference compares strings
        return [ctx.emit("string_equal", [a, b])]
    return [ctx.emit(BINARY[node.op_type], [a, b])]


@onnx_op("Div")
def div(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # ONNX integer division truncates toward zero, as C does.
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    rounding = "trunc" if ctx.b.dtype(a).is_int else "none"
    return [ctx.emit("div", [a, b], rounding=rounding)]


@onnx_op("Mod")
def mod(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    fmod = bool(node.attr("fmod", 0))
    return [ctx.emit("mod", [a, b], fmod=fmod)]


@onnx_op("Pow")
def pow_(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # ONNX lets the exponent have another type; the result has the base's type.
    x, y = ctx.input(node, 0), ctx.input(node, 1)
    dx, dy = ctx.b.dtype(x), ctx.b.dtype(y)
    if dx.is_float:
        return [ctx.emit("pow", [x, ctx.cast(y, dx)])]
    if dy.is_int:
        return [ctx.emit("pow", [x, ctx.cast(y, dx)])]
    out = ctx.emit("pow", [ctx.cast(x, dy), y])
    return [ctx.cast(out, dx)]


@onnx_op(*VARIADIC)
def variadic(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    xs = [ctx.input(node, i) for i in range(len(node.inputs)) if node.has_input(i)]
    acc = xs[0]
    for x in xs[1:]:
        acc = ctx.emit(VARIADIC[node.op_type], [acc, x])
    if len(xs) == 1:
        acc = ctx.emit("expand", [acc], shape=list(ctx.b.shape(acc)))
    return [acc]


@onnx_op("Mean")
def mean(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    xs = [ctx.input(node, i) for i in range(len(node.inputs)) if node.has_input(i)]
    acc = xs[0]
    for x in xs[1:]:
        acc = ctx.emit("add", [acc, x])
    return [ctx.emit("div", [acc, ctx.scalar(len(xs), acc)])]


@onnx_op("Where")
def where(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [ctx.emit("where", [ctx.input(node, i) for i in range(3)])]


@onnx_op("Identity")
def identity(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    c = ctx.const(node.inputs[0])
    if c is not None:
        return [c]
    return [ctx.input(node, 0)]


def _cast_to(ctx: ImportContext, name: str, to: DType, saturate: bool = True, round_mode: str = "up") -> Out:
    if to is DType.string and ctx.dtype(name).is_narrow:
        raise UnsupportedOpError("Cast", detail=f"{ctx.dtype(name).value} to string (ONNX's reference has no such "
                                 "cast: numpy has no str of an ml_dtypes value)")
    c = ctx.const(name)
    if c is not None:  # CastLike(constant, x) depends only on x's type: keep it foldable
        return _cast_const(c, to, saturate, round_mode)
    x = ctx.value(name)
    if ctx.b.dtype(x) is to:
        return x
    extra: dict[str, object] = {}
    if not saturate and (to.is_float8 or to is DType.float8_e8m0fnu):
        extra["saturate"] = False
    if to is DType.float8_e8m0fnu and round_mode != "up":
        extra["round_mode"] = round_mode
    return ctx.emit("cast", [x], dtype=to.value, **extra)


def _cast_const(c: np.ndarray, to: DType, saturate: bool = True, round_mode: str = "up") -> np.ndarray:
    if to is DType.string:  # numpy's str of each element, as ONNX's reference casts (oracle kernels: _string_cast)
        return np.asarray(c).astype(np.str_).astype(object)
    if to.is_narrow or c.dtype.name in NARROW_NAMES:
        return narrow_cast(np.asarray(c), to, saturate, round_mode)
    if c.dtype.kind == "f" and to.is_int:
        info = np.iinfo(to.np)
        with np.errstate(invalid="ignore"):
            c = np.clip(np.nan_to_num(np.trunc(c), nan=0.0), info.min, info.max)
    return np.asarray(c).astype(to.np)


def _cast_options(node: OnnxNode) -> tuple[bool, str]:
    """Cast's `saturate` (read by float8 targets only: ONNX ignores it for the rest) and `round_mode` (read by
    float8e8m0 only)."""
    mode = node.attr("round_mode", "up")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    if mode not in E8M0_ROUND_MODES:
        raise node.refuse(f"round_mode {mode!r} (one of {', '.join(E8M0_ROUND_MODES)})")
    return bool(node.attr("saturate", 1)), mode


@onnx_op("Cast")
def cast(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    to = onnx_dtype(int(node.attr("to")), "Cast target")
    return [_cast_to(ctx, node.inputs[0], to, *_cast_options(node))]


@onnx_op("CastLike")
def cast_like(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [_cast_to(ctx, node.inputs[0], ctx.dtype(node.inputs[1]), *_cast_options(node))]


@onnx_op("IsNaN")
def isnan(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    return [ctx.emit("ne", [x, x])]


@onnx_op("IsInf")
def isinf(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    pos, neg = ctx.emit("eq", [x, ctx.scalar(np.inf, x)]), ctx.emit("eq", [x, ctx.scalar(-np.inf, x)])
    want_pos, want_neg = bool(node.attr("detect_positive", 1)), bool(node.attr("detect_negative", 1))
    if want_pos and want_neg:
        return [ctx.emit("logical_or", [pos, neg])]
    if want_pos:
        return [pos]
    if want_neg:
        return [neg]
    return [ctx.emit("logical_and", [pos, neg])]


@onnx_op("Clip")
def clip(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    bounds = _constant_bounds(ctx, node)
    if bounds is not None and ctx.b.dtype(x).is_float:
        # The clamp composite (ReLU6, hardtanh): kept whole for backends that fuse it into the conv before.
        return [ctx.emit("clamp", [x], min=bounds[0], max=bounds[1])]
    if node.version < 11:
        lo, hi = node.attr("min"), node.attr("max")
        los = ctx.scalar(lo, x) if lo is not None else ""
        his = ctx.scalar(hi, x) if hi is not None else ""
    else:
        los, his = ctx.input(node, 1), ctx.input(node, 2)
    if los:
        x = ctx.emit("maximum", [x, los])
    if his:
        x = ctx.emit("minimum", [x, his])
    if not los and not his:
        x = ctx.emit("expand", [x], shape=list(ctx.b.shape(x)))
    return [x]


def _constant_bounds(ctx: ImportContext, node: OnnxNode) -> tuple[float | None, float | None] | None:
    """Clip's (min, max) when both are absent or scalars known at import, else None."""
    if node.version < 11:
        lo, hi = node.attr("min"), node.attr("max")
        return (None if lo is None else float(lo), None if hi is None else float(hi))
    found: list[float | None] = []
    for i in (1, 2):
        if not node.has_input(i):
            found.append(None)
            continue
        value = ctx.const(node.inputs[i])
        if value is None or value.size != 1:
            return None
        found.append(float(value.reshape(())))
    return found[0], found[1]


@onnx_op("BitShift")
def bit_shift(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # Shifts as int64 multiply / floor-divide by powers of two, with ONNX's rules made explicit: a left
    # shift wraps modulo 2^width, a right shift is arithmetic, and a shift outside [0, width) gives 0
    # (or -1 for a negative signed value shifted right).
    x, y = ctx.input(node, 0), ctx.input(node, 1)
    dtype = ctx.b.dtype(x)
    width = dtype.itemsize * 8
    signed = dtype.is_signed_int
    left = node.attr("direction") == "LEFT"
    if dtype is DType.uint64:
        raise node.refuse("shift of uint64 (its values do not fit the int64 the shift is computed in)")
    if dtype is DType.int64 and left:
        raise node.refuse("left shift of int64 (needs 64-bit wrapping arithmetic)")
    xi, yi = ctx.cast(x, DType.int64), ctx.cast(y, DType.int64)
    outside = ctx.emit("logical_or", [ctx.emit("lt", [yi, ctx.scalar(0, yi)]),
                                      ctx.emit("ge", [yi, ctx.scalar(width, yi)])])
    step = ctx.emit("where", [outside, ctx.scalar(0, yi), yi])
    step = ctx.emit("minimum", [step, ctx.scalar(62, step)])
    scale = ctx.emit("pow", [ctx.scalar(2, step), step])
    if left:
        out = ctx.emit("mod", [ctx.emit("mul", [xi, scale]), ctx.scalar(2 ** width, xi)])
        if signed:
            wrapped = ctx.emit("sub", [out, ctx.scalar(2 ** width, out)])
            out = ctx.emit("where", [ctx.emit("ge", [out, ctx.scalar(2 ** (width - 1), out)]), wrapped, out])
        out = ctx.emit("where", [outside, ctx.scalar(0, out), out])
    else:
        out = ctx.emit("div", [xi, scale], rounding="floor")
        big = ctx.emit("ge", [yi, ctx.scalar(63, yi)]) if width == 64 else outside
        fill = ctx.emit("where", [ctx.emit("lt", [xi, ctx.scalar(0, xi)]), ctx.scalar(-1, xi), ctx.scalar(0, xi)]) \
            if signed else ctx.scalar(0, xi)
        out = ctx.emit("where", [ctx.emit("logical_or", [big, outside]), fill, out])
    return [ctx.cast(out, dtype)]
