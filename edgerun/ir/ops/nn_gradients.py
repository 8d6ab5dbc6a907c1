"""Direct vector-Jacobian products of composites (ops/nn_ops.py) where they are cheaper or steadier than
differentiating the decomposition: relu and clamp (one mask, and torch's zero gradient at a bound), softmax
and log-softmax (the output alone, no max or exponentials recomputed), layer norm (one pass over the
normalised axes).
Every other composite is differentiated through its decomposition."""

from __future__ import annotations

from edgerun.ir.builder import Builder
from edgerun.ir.graph import Node
from edgerun.ir.ops._grad import as_float, unbroadcast
from edgerun.ir.registry import register_gradient

Grads = list[str | None]


def _axis(b: Builder, node: Node) -> int:
    rank = len(b.shape(node.inputs[0]))
    return int(node.attrs.get("axis", -1)) % max(rank, 1)


@register_gradient("relu")
def _relu(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g, x = grads[0], node.inputs[0]
    if g is None or not needs[0]:
        return [None]
    return [b.binary("mul", g, as_float(b, b.binary("gt", x, b.scalar(0.0, x)), g))]


@register_gradient("clamp")
def _clamp(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    """The gradient passes strictly inside the bounds, as torch's hardtanh (ReLU6) does: a value exactly at a
    bound (a ReLU6 over a window of zeros) gets none, where maximum/minimum would split it."""
    g, x = grads[0], node.inputs[0]
    if g is None or not needs[0]:
        return [None]
    inside = None
    for key, op in (("min", "gt"), ("max", "lt")):
        if node.attrs.get(key) is not None:
            test = b.binary(op, x, b.scalar(float(node.attrs[key]), x))
            inside = test if inside is None else b.binary("logical_and", inside, test)
    return [g if inside is None else b.binary("mul", g, as_float(b, inside, g))]


@register_gradient("softmax")
def _softmax(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g, y = grads[0], node.outputs[0]
    if g is None or not needs[0]:
        return [None]
    gy = b.binary("mul", g, y)
    total = b.emit("reduce_sum", [gy], axes=[_axis(b, node)], keepdims=True)
    return [b.binary("sub", gy, b.binary("mul", y, total))]


@register_gradient("log_softmax")
def _log_softmax(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g, y = grads[0], node.outputs[0]
    if g is None or not needs[0]:
        return [None]
    total = b.emit("reduce_sum", [g], axes=[_axis(b, node)], keepdims=True)
    return [b.binary("sub", g, b.binary("mul", b.unary("exp", y), total))]


@register_gradient("layer_norm")
def _layer_norm(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g = grads[0]
    out: Grads = [None] * len(node.inputs)
    if g is None:
        return out
    x = node.inputs[0]
    shape = b.shape(x)
    k = int(node.attrs.get("normalized_ndim", 1))
    axes = list(range(len(shape) - k, len(shape)))
    weight = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else ""
    bias = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else ""
    centered = b.binary("sub", x, b.emit("reduce_mean", [x], axes=axes, keepdims=True))
    var = b.emit("reduce_mean", [b.binary("mul", centered, centered)], axes=axes, keepdims=True)
    inv = b.unary("rsqrt", b.binary("add", var, b.scalar(float(node.attrs.get("eps", 1e-5)), var)))
    xhat = b.binary("mul", centered, inv)
    if weight and needs[1]:
        out[1] = unbroadcast(b, b.binary("mul", g, xhat), b.shape(weight))
    if bias and needs[2]:
        out[2] = unbroadcast(b, g, b.shape(bias))
    if needs[0]:
        gx = b.binary("mul", g, weight) if weight else g
        mean_g = b.emit("reduce_mean", [gx], axes=axes, keepdims=True)
        mean_gx = b.emit("reduce_mean", [b.binary("mul", gx, xhat)], axes=axes, keepdims=True)
        out[0] = b.binary("mul", inv, b.binary("sub", b.binary("sub", gx, mean_g), b.binary("mul", xhat, mean_gx)))
    return out
