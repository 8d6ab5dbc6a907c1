"""ONNX Runtime's fused activations (domain com.microsoft), as ORT's transformer optimizer emits them:
Gelu and BiasGelu (erf GELU of x, or of x + bias), FastGelu (the tanh approximation, optional bias), QuickGelu
(x * sigmoid(alpha * x), CLIP's). Each is the IR's gelu / sigmoid after the bias add: no new op.
Semantics from ORT's ContribOperators.md; tests/onnx/test_onnx_contrib_ops.py compares with ORT's own kernels.
"""

from __future__ import annotations

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op


def _with_bias(ctx: ImportContext, node: OnnxNode) -> str:
    x = ctx.input(node, 0)
    return ctx.emit("add", [x, ctx.input(node, 1)]) if node.has_input(1) else x


@onnx_op("com.microsoft:Gelu", "com.microsoft:BiasGelu")
def gelu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [ctx.emit("gelu", [_with_bias(ctx, node)], approximate="none")]


@onnx_op("com.microsoft:FastGelu")
def fast_gelu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [ctx.emit("gelu", [_with_bias(ctx, node)], approximate="tanh")]


@onnx_op("com.microsoft:QuickGelu")
def quick_gelu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    alpha = node.float_attr("alpha", 1.702)
    return [ctx.emit("mul", [x, ctx.emit("sigmoid", [ctx.emit("mul", [x, ctx.scalar(alpha, x)])])])]
