"""Activation and softmax-family ONNX ops, mapped onto our composites or short atomic formulas."""

from __future__ import annotations

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType


def _x(ctx: ImportContext, node: OnnxNode) -> str:
    return ctx.input(node, 0)


@onnx_op("Relu")
def relu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [ctx.emit("relu", [_x(ctx, node)])]


@onnx_op("LeakyRelu")
def leaky_relu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [ctx.emit("leaky_relu", [_x(ctx, node)], alpha=node.float_attr("alpha", 0.01))]


@onnx_op("PRelu")
def prelu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x, slope = _x(ctx, node), ctx.input(node, 1)
    neg = ctx.emit("mul", [x, slope])
    return [ctx.emit("where", [ctx.emit("lt", [x, ctx.scalar(0, x)]), neg, x])]


@onnx_op("ThresholdedRelu")
def thresholded_relu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _x(ctx, node)
    keep = ctx.emit("gt", [x, ctx.scalar(float(node.attr("alpha", 1.0)), x)])
    return [ctx.emit("where", [keep, x, ctx.scalar(0, x)])]


def _elu_core(ctx: ImportContext, x: str, alpha: float) -> str:
    neg = ctx.emit("mul", [ctx.emit("sub", [ctx.emit("exp", [x]), ctx.scalar(1.0, x)]), ctx.scalar(alpha, x)])
    return ctx.emit("where", [ctx.emit("gt", [x, ctx.scalar(0, x)]), x, neg])


@onnx_op("Elu")
def elu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [_elu_core(ctx, _x(ctx, node), float(node.attr("alpha", 1.0)))]


@onnx_op("Celu")
def celu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x, alpha = _x(ctx, node), float(node.attr("alpha", 1.0))
    scaled = ctx.emit("div", [x, ctx.scalar(alpha, x)])
    neg = ctx.emit("mul", [ctx.emit("sub", [ctx.emit("exp", [scaled]), ctx.scalar(1.0, x)]), ctx.scalar(alpha, x)])
    return [ctx.emit("add", [ctx.emit("relu", [x]), ctx.emit("minimum", [neg, ctx.scalar(0.0, x)])])]


@onnx_op("Selu")
def selu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _x(ctx, node)
    alpha = float(node.attr("alpha", 1.67326319217681884765625))
    gamma = float(node.attr("gamma", 1.05070102214813232421875))
    return [ctx.emit("mul", [_elu_core(ctx, x, alpha), ctx.scalar(gamma, x)])]


@onnx_op("HardSigmoid")
def hard_sigmoid(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [ctx.emit("hardsigmoid", [_x(ctx, node)], alpha=node.float_attr("alpha", 0.2),
                     beta=float(node.attr("beta", 0.5)))]


@onnx_op("HardSwish")
def hard_swish(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _x(ctx, node)
    if ctx.b.dtype(x) is DType.float64:
        # ONNX defines it as x * HardSigmoid(alpha=1/6 as a float32 attribute): exact 1/6 would differ by 1e-8.
        gate = ctx.emit("hardsigmoid", [x], alpha=float(np.float32(1 / 6)), beta=0.5)
        return [ctx.emit("mul", [x, gate])]
    return [ctx.emit("hardswish", [x])]


@onnx_op("Gelu")
def gelu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [ctx.emit("gelu", [_x(ctx, node)], approximate=node.attr("approximate", "none"))]


def _softplus(ctx: ImportContext, x: str) -> str:
    # log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): no overflow for large x.
    tail = ctx.emit("log", [ctx.emit("add", [ctx.scalar(1.0, x), ctx.emit("exp", [ctx.emit("neg", [ctx.emit("abs", [x])])])])])
    return ctx.emit("add", [ctx.emit("relu", [x]), tail])


@onnx_op("Softplus")
def softplus(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [_softplus(ctx, _x(ctx, node))]


@onnx_op("Mish")
def mish(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _x(ctx, node)
    return [ctx.emit("mul", [x, ctx.emit("tanh", [_softplus(ctx, x)])])]


@onnx_op("Softsign")
def softsign(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _x(ctx, node)
    return [ctx.emit("div", [x, ctx.emit("add", [ctx.emit("abs", [x]), ctx.scalar(1.0, x)])])]


@onnx_op("Swish")
def swish(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _x(ctx, node)
    alpha = float(node.attr("alpha", 1.0))
    return [ctx.emit("mul", [x, ctx.emit("sigmoid", [ctx.emit("mul", [x, ctx.scalar(alpha, x)])])])]


@onnx_op("Shrink")
def shrink(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _x(ctx, node)
    lambd, bias = float(node.attr("lambd", 0.5)), float(node.attr("bias", 0.0))
    if ctx.b.dtype(x).is_int and (lambd != int(lambd) or bias != int(bias)):
        raise node.refuse("fractional lambd or bias on an integer tensor")
    lo = ctx.emit("lt", [x, ctx.scalar(-lambd, x)])
    hi = ctx.emit("gt", [x, ctx.scalar(lambd, x)])
    plus = ctx.emit("add", [x, ctx.scalar(bias, x)])
    minus = ctx.emit("sub", [x, ctx.scalar(bias, x)])
    return [ctx.emit("where", [lo, plus, ctx.emit("where", [hi, minus, ctx.scalar(0, x)])])]


def _coerced_2d(ctx: ImportContext, node: OnnxNode, x: str) -> int:
    """Softmax before opset 13 flattens to 2-D at axis; it equals ours only when axis is the last one."""
    rank = len(ctx.b.shape(x))
    axis = int(node.attr("axis", 1 if node.version < 13 else -1))
    if node.version < 13 and axis % max(rank, 1) != rank - 1:
        raise node.refuse(f"opset-{node.version} {node.op_type} over axes {axis}.. (flattened) is not supported")
    return axis


@onnx_op("Softmax")
def softmax(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _x(ctx, node)
    return [ctx.emit("softmax", [x], axis=_coerced_2d(ctx, node, x))]


@onnx_op("LogSoftmax")
def log_softmax(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _x(ctx, node)
    return [ctx.emit("log_softmax", [x], axis=_coerced_2d(ctx, node, x))]


@onnx_op("Hardmax")
def hardmax(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    import numpy as np

    x = _x(ctx, node)
    axis = _coerced_2d(ctx, node, x)
    shape = ctx.b.shape(x)
    axis %= len(shape)
    idx = ctx.emit("argmax", [x], axis=axis, keepdims=True)
    iota_shape = [1] * len(shape)
    iota_shape[axis] = shape[axis]
    iota = ctx.b.const(np.arange(shape[axis], dtype=np.int64).reshape(iota_shape))
    hit = ctx.emit("eq", [idx, iota])
    return [ctx.emit("where", [hit, ctx.scalar(1, x), ctx.scalar(0, x)])]

