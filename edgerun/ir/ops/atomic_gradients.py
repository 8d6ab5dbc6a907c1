"""Vector-Jacobian products of the elementwise, reduction, matmul and gather atomic ops (ops/atomic.py), and
the atomic ops that have none.

Each rule follows torch.autograd's convention at the points where the derivative is a choice: maximum and
minimum split a tie's gradient in half; reduce_max/min share it evenly among the tied elements; floor, ceil,
round and sign have a zero gradient.
"""

from __future__ import annotations

import math

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.graph import Node
from edgerun.ir.ops._grad import as_float, expand_to, kept_reduction, reshape_to, swap_last, unbroadcast
from edgerun.ir.registry import NoGradientError, register_gradient, register_no_gradient

Grads = list[str | None]


def _unary(fn):  # type: ignore[no-untyped-def]
    """A rule from `fn(b, x, y, g) -> cotangent of x`."""
    def rule(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
        g = grads[0]
        if g is None or not needs[0]:
            return [None]
        return [fn(b, node.inputs[0], node.outputs[0], g)]
    return rule


def _mul(b: Builder, *xs: str) -> str:
    out = xs[0]
    for x in xs[1:]:
        out = b.binary("mul", out, x)
    return out


def _c(b: Builder, value: float, like: str) -> str:
    return b.scalar(value, like)


register_gradient("exp")(_unary(lambda b, x, y, g: b.binary("mul", g, y)))
register_gradient("log")(_unary(lambda b, x, y, g: b.binary("div", g, x)))
register_gradient("sqrt")(_unary(lambda b, x, y, g: b.binary("div", b.binary("mul", g, _c(b, 0.5, g)), y)))
register_gradient("rsqrt")(_unary(lambda b, x, y, g: _mul(b, g, y, y, y, _c(b, -0.5, g))))
register_gradient("tanh")(_unary(lambda b, x, y, g: b.binary("mul", g, b.binary("sub", _c(b, 1.0, y),
                                                                                 b.binary("mul", y, y)))))
register_gradient("sigmoid")(_unary(lambda b, x, y, g: _mul(b, g, y, b.binary("sub", _c(b, 1.0, y), y))))
register_gradient("erf")(_unary(lambda b, x, y, g: _mul(
    b, g, b.unary("exp", b.unary("neg", b.binary("mul", x, x))), _c(b, 2 / math.sqrt(math.pi), x))))
register_gradient("sin")(_unary(lambda b, x, y, g: b.binary("mul", g, b.unary("cos", x))))
register_gradient("cos")(_unary(lambda b, x, y, g: b.binary("mul", g, b.unary("neg", b.unary("sin", x)))))
register_gradient("neg")(_unary(lambda b, x, y, g: b.unary("neg", g)))
register_gradient("abs")(_unary(lambda b, x, y, g: b.binary("mul", g, b.unary("sign", x))))
register_gradient("reciprocal")(_unary(lambda b, x, y, g: b.unary("neg", _mul(b, g, y, y))))


@register_gradient("floor", "ceil", "round", "sign")
def _piecewise_constant(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    return [None]  # zero almost everywhere


# ---- binary ------------------------------------------------------------------------------------------

def _binary(fn):  # type: ignore[no-untyped-def]
    """A rule from `fn(b, a, b_, y, g, needs) -> (cotangent of a, of b)` at the broadcast shape."""
    def rule(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
        g = grads[0]
        if g is None:
            return [None, None]
        a, c = node.inputs
        ga, gc = fn(b, a, c, node.outputs[0], g, needs)
        return [unbroadcast(b, ga, b.shape(a)) if ga is not None and needs[0] else None,
                unbroadcast(b, gc, b.shape(c)) if gc is not None and needs[1] else None]
    return rule


register_gradient("add")(_binary(lambda b, a, c, y, g, needs: (g, g)))
register_gradient("sub")(_binary(lambda b, a, c, y, g, needs: (g, b.unary("neg", g) if needs[1] else None)))
register_gradient("mul")(_binary(lambda b, a, c, y, g, needs: (
    b.binary("mul", g, c) if needs[0] else None, b.binary("mul", g, a) if needs[1] else None)))


@register_gradient("div")
def _div(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    if node.attrs.get("rounding", "none") != "none":
        return [None, None]  # floor or trunc division: piecewise constant

    def parts(b: Builder, a: str, c: str, y: str, g: str, needs: list[bool]) -> tuple[str | None, str | None]:
        return (b.binary("div", g, c) if needs[0] else None,
                b.unary("neg", b.binary("div", b.binary("mul", g, y), c)) if needs[1] else None)
    return _binary(parts)(b, node, grads, needs)  # type: ignore[no-any-return]


def _pow_parts(b: Builder, a: str, c: str, y: str, g: str, needs: list[bool]) -> tuple[str | None, str | None]:
    ga = gc = None
    if needs[0]:  # c * a^(c-1)
        ga = _mul(b, g, c, b.binary("pow", a, b.binary("sub", c, _c(b, 1.0, c))))
    if needs[1]:  # y * log(a), zero where a == 0 (torch's convention)
        zero = b.binary("eq", a, _c(b, 0.0, a))
        safe = b.emit("where", [zero, _c(b, 1.0, a), a])
        gc = _mul(b, g, y, b.unary("log", safe))
    return ga, gc


register_gradient("pow")(_binary(_pow_parts))


def _extremum(pick: str):  # type: ignore[no-untyped-def]
    """maximum (pick "gt") / minimum (pick "lt"): the winner takes the gradient, a tie splits it in half."""
    def parts(b: Builder, a: str, c: str, y: str, g: str, needs: list[bool]) -> tuple[str, str]:
        share = b.binary("add", as_float(b, b.binary(pick, a, c), g),
                         b.binary("mul", as_float(b, b.binary("eq", a, c), g), _c(b, 0.5, g)))
        ga = b.binary("mul", g, share)
        return ga, b.binary("sub", g, ga)
    return parts


register_gradient("maximum")(_binary(_extremum("gt")))
register_gradient("minimum")(_binary(_extremum("lt")))


@register_gradient("mod")
def _mod(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    fmod = bool(node.attrs.get("fmod"))

    def parts(b: Builder, a: str, c: str, y: str, g: str, needs: list[bool]) -> tuple[str, str | None]:
        if not needs[1]:
            return g, None
        q = b.binary("div", a, c)  # a mod c = a - c * round_toward(q): d/dc = -round_toward(q)
        if fmod:
            whole = b.emit("where", [b.binary("lt", q, _c(b, 0.0, q)), b.unary("ceil", q), b.unary("floor", q)])
        else:
            whole = b.unary("floor", q)
        return g, b.unary("neg", b.binary("mul", g, whole))
    return _binary(parts)(b, node, grads, needs)  # type: ignore[no-any-return]


@register_gradient("where")
def _where(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g = grads[0]
    if g is None:
        return [None, None, None]
    cond, x, y = node.inputs
    zero = _c(b, 0.0, g)
    gx = unbroadcast(b, b.emit("where", [cond, g, zero]), b.shape(x)) if needs[1] else None
    gy = unbroadcast(b, b.emit("where", [cond, zero, g]), b.shape(y)) if needs[2] else None
    return [None, gx, gy]


@register_gradient("cast")
def _cast(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g, x = grads[0], node.inputs[0]
    if g is None or not needs[0] or not (b.dtype(x).is_float and b.dtype(g).is_float):
        return [None]  # an integer on either side: no gradient flows (as in torch)
    return [b.emit("cast", [g], dtype=b.dtype(x).value)]


# ---- reductions --------------------------------------------------------------------------------------

def _reduce_parts(b: Builder, node: Node, g: str) -> tuple[str, tuple[int, ...]]:
    x = node.inputs[0]
    shape = b.shape(x)
    return kept_reduction(b, g, shape, node.attrs.get("axes"), bool(node.attrs.get("keepdims", False))), shape


@register_gradient("reduce_sum")
def _reduce_sum(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    if grads[0] is None:
        return [None]
    g, shape = _reduce_parts(b, node, grads[0])
    return [expand_to(b, g, shape)]


@register_gradient("reduce_mean")
def _reduce_mean(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    if grads[0] is None:
        return [None]
    g, shape = _reduce_parts(b, node, grads[0])
    count = int(np.prod(shape)) // max(int(np.prod(b.shape(g))), 1)
    return [expand_to(b, b.binary("mul", g, _c(b, 1.0 / max(count, 1), g)), shape)]


@register_gradient("reduce_max", "reduce_min")
def _reduce_extremum(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    if grads[0] is None:
        return [None]
    g, _ = _reduce_parts(b, node, grads[0])
    y, _ = _reduce_parts(b, node, node.outputs[0])
    hit = as_float(b, b.binary("eq", node.inputs[0], y), g)
    ties = b.emit("reduce_sum", [hit], axes=node.attrs.get("axes"), keepdims=True)
    return [b.binary("mul", hit, b.binary("div", g, ties))]


# ---- matmul and gather -------------------------------------------------------------------------------

@register_gradient("matmul")
def _matmul(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g = grads[0]
    if g is None:
        return [None, None]
    a, c = node.inputs
    ga = unbroadcast(b, b.emit("matmul", [g, swap_last(b, c)]), b.shape(a)) if needs[0] else None
    gc = None
    if needs[1] and len(b.shape(c)) == 2 and len(b.shape(a)) > 2:
        # A matrix shared by every batch (a linear layer over a sequence): one product over all the batch's rows,
        # [rows, K]^T [rows, N], not one small product per batch summed after (DIN's attention MLP on ONNX
        # Runtime: 32 products of [128, 20] x [20, 36] and a sum over them).
        rows = int(np.prod(b.shape(a)[:-1]))
        gc = b.emit("matmul", [swap_last(b, reshape_to(b, a, [rows, b.shape(a)[-1]])),
                               reshape_to(b, g, [rows, b.shape(g)[-1]])])
    elif needs[1]:
        gc = unbroadcast(b, b.emit("matmul", [swap_last(b, a), g]), b.shape(c))
    return [ga, gc]


@register_gradient("gather")
def _gather(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    """The taken slices' cotangents summed back to the indices they were taken from: a scatter_add (gather's
    transpose) into zeros. An embedding's padding row (attr padding_index) takes none: its updates are
    zeroed before the sum, as torch's Embedding(padding_idx=...) leaves that row untrained."""
    g = grads[0]
    if g is None or not needs[0]:
        return [None, None]
    if node.attrs.get("scale_grad_by_freq"):
        raise NoGradientError(f"node {node.name!r} (gather): an embedding with scale_grad_by_freq has no gradient "
                              "rule here")
    data, idx = node.inputs
    shape = b.shape(data)
    axis = int(node.attrs.get("axis", 0)) % max(len(shape), 1)
    padding = node.attrs.get("padding_index")
    if padding is not None:
        rows = shape[axis]
        wrapped = b.emit("where", [b.binary("lt", idx, b.scalar(0, idx)), b.binary("add", idx, b.scalar(rows, idx)),
                                   idx])
        trains = b.binary("ne", wrapped, b.scalar(int(padding) % rows, idx))
        view = [1] * axis + list(b.shape(idx)) + [1] * (len(shape) - axis - 1)
        g = b.emit("where", [reshape_to(b, trains, view), g, _c(b, 0.0, g)])
    zeros = expand_to(b, _c(b, 0.0, g), shape) if shape else _c(b, 0.0, g)
    return [b.emit("scatter_add", [zeros, idx, g], axis=axis), None]


@register_gradient("scatter_add")
def _scatter_add(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    """The data's cotangent passes through; each update's is the output cotangent at the slice it was added
    to (a gather)."""
    g = grads[0]
    if g is None:
        return [None, None, None]
    axis = int(node.attrs.get("axis", 0))
    gu = b.emit("gather", [g, node.inputs[1]], axis=axis) if needs[2] else None
    return [g if needs[0] else None, None, gu]


@register_gradient("update_slice")
def _update_slice(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    """The rows written take their cotangent from the output; the rest of it goes to the input tensor."""
    g = grads[0]
    if g is None:
        return [None, None, None]
    x, update, start = node.inputs
    shape, ushape = b.shape(x), b.shape(update)
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    rows, n = shape[axis], ushape[axis]
    first = b.emit("maximum", [b.emit("minimum", [reshape_to(b, start, [1]), b.scalar(rows - n, start)]),
                               b.scalar(0, start)])  # clamped as the kernel clamps it
    span = [1] * len(shape)
    span[axis] = rows
    pos = b.const(np.arange(rows).reshape(span), b.dtype(start))
    first_b = reshape_to(b, first, [1] * len(shape))
    inside = b.binary("logical_and", b.binary("ge", pos, first_b),
                      b.binary("lt", pos, b.binary("add", first_b, b.scalar(n, start))))
    gx = b.emit("where", [inside, _c(b, 0.0, g), g]) if needs[0] else None
    gu = b.emit("gather", [g, b.binary("add", first, b.const(np.arange(n), b.dtype(start)))], axis=axis) \
        if needs[1] else None
    return [gx, gu, None]


register_no_gradient(["logical_not", "logical_and", "logical_or", "logical_xor"], "boolean logic")
register_no_gradient(["eq", "ne", "lt", "le", "gt", "ge"], "a comparison: its output is bool")
register_no_gradient(["argmax", "argmin"], "its output is an integer index")
register_no_gradient(["bitcast"], "a reinterpretation of bits, not a function of the value")
register_no_gradient(["label_encode", "regex_full_match", "string_concat", "string_equal", "tfidf_vectorizer"],
                     "string and table lookups are not differentiable")
register_no_gradient(["conv_integer", "dequantize_linear", "dynamic_quantize", "matmul_int4", "matmul_integer",
                      "quantize_linear", "quantized_add", "requantize"],
                     "quantized integer arithmetic (train in float, quantize the trained program after)")
