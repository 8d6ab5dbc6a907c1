"""ONNX's optimizer update ops (ai.onnx.preview.training): Adagrad, Adam and Momentum.

Each is one step of an update rule, a deterministic elementwise function of its inputs (learning rate R,
step count T, and per tensor: the weights X, the gradient G and the optimizer's accumulators). They import
as compositions of elementwise IR ops, following ONNX's reference (onnx/reference/ops/
aionnx_preview_training/). The branches on T (Adam's bias correction, Momentum's first-step coefficient)
read T at run time, so they become `where`. Several tensors in one node update independently: inputs are
R, T, then the X's, the G's, and each accumulator's list in turn; outputs are X_new's then the accumulators'.

Gradient (the same domain) is left refused: it needs automatic differentiation of a graph, which edgerun
does not have.
"""

from __future__ import annotations

from collections.abc import Callable

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op

DOMAIN = "ai.onnx.preview.training"

# One tensor's update: (ctx, r, t, x, g, accumulators) -> (x_new, *accumulators_new), all IR values.
Update = Callable[[ImportContext, str, str, str, str, list[str]], list[str]]


def _per_tensor(ctx: ImportContext, node: OnnxNode, accumulators: int, update: Update) -> list[Out]:
    """Split the node's inputs per tensor, update each, and order outputs as ONNX does."""
    streams = 2 + accumulators  # X, G, then each accumulator
    rest = node.inputs[2:]
    if len(node.inputs) < 2 or not rest or len(rest) % streams:
        raise node.refuse(f"expects R, T and {streams} lists of equal length, got {len(node.inputs)} inputs")
    n = len(rest) // streams
    r, t = ctx.input(node, 0), ctx.input(node, 1)
    per_output: list[list[str]] = [[] for _ in range(1 + accumulators)]
    for i in range(n):
        x = ctx.value(rest[i])
        if not ctx.b.dtype(x).is_float or ctx.b.dtype(x).is_narrow:
            raise node.refuse(f"{node.op_type} of {ctx.b.dtype(x).value} weights (float32 or float64 only)")
        dtype = ctx.b.dtype(x)
        g = ctx.value(rest[n + i])
        accs = [ctx.cast(ctx.value(rest[(2 + k) * n + i]), dtype) for k in range(accumulators)]
        outs = update(ctx, ctx.cast(r, dtype), ctx.cast(t, dtype), x, ctx.cast(g, dtype), accs)
        for k, out in enumerate(outs):
            per_output[k].append(out)
    return [v for group in per_output for v in group]


def _k(ctx: ImportContext, value: float, like: str) -> str:
    return ctx.scalar(value, like)


def _regularized(ctx: ImportContext, node: OnnxNode, x: str, g: str) -> str:
    """G + norm_coefficient * X (the gradient of the L2 regularisation term added)."""
    return ctx.emit("add", [ctx.emit("mul", [_k(ctx, node.float_attr("norm_coefficient", 0.0), x), x]), g])


@onnx_op(f"{DOMAIN}:Adagrad")
def adagrad(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    decay, eps = node.float_attr("decay_factor", 0.0), node.float_attr("epsilon", 0.0)

    def update(ctx: ImportContext, r: str, t: str, x: str, g: str, accs: list[str]) -> list[str]:
        (h,) = accs
        # r / (1 + t * decay_factor): the learning rate decays with the step count
        rate = ctx.emit("div", [r, ctx.emit("add", [_k(ctx, 1.0, t), ctx.emit("mul", [t, _k(ctx, decay, t)])])])
        g_reg = _regularized(ctx, node, x, g)
        h_new = ctx.emit("add", [h, ctx.emit("mul", [g_reg, g_reg])])
        scale = ctx.emit("add", [ctx.emit("sqrt", [h_new]), _k(ctx, eps, h_new)])
        step = ctx.emit("div", [ctx.emit("mul", [rate, g_reg]), scale])
        return [ctx.emit("sub", [x, step]), h_new]
    return _per_tensor(ctx, node, 1, update)


@onnx_op(f"{DOMAIN}:Adam")
def adam(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    alpha, beta = node.float_attr("alpha", 0.9), node.float_attr("beta", 0.999)
    eps = node.float_attr("epsilon", 0.0)
    post = node.float_attr("norm_coefficient_post", 0.0)

    def update(ctx: ImportContext, r: str, t: str, x: str, g: str, accs: list[str]) -> list[str]:
        v, h = accs
        g_reg = _regularized(ctx, node, x, g)
        v_new = ctx.emit("add", [ctx.emit("mul", [_k(ctx, alpha, v), v]),
                                 ctx.emit("mul", [_k(ctx, 1.0 - alpha, g_reg), g_reg])])
        h_new = ctx.emit("add", [ctx.emit("mul", [_k(ctx, beta, h), h]),
                                 ctx.emit("mul", [_k(ctx, 1.0 - beta, g_reg), ctx.emit("mul", [g_reg, g_reg])])])
        h_sqrt = ctx.emit("add", [ctx.emit("sqrt", [h_new]), _k(ctx, eps, h_new)])
        # Bias correction r * sqrt(1 - beta^t) / (1 - alpha^t) from the first step (t > 0); r itself at t = 0
        one = _k(ctx, 1.0, t)
        corrected = ctx.emit("div", [
            ctx.emit("mul", [r, ctx.emit("sqrt", [ctx.emit("sub", [one, ctx.emit("pow", [_k(ctx, beta, t), t])])])]),
            ctx.emit("sub", [one, ctx.emit("pow", [_k(ctx, alpha, t), t])])])
        rate = ctx.emit("where", [ctx.emit("gt", [t, _k(ctx, 0.0, t)]), corrected, r])
        x_new = ctx.emit("sub", [x, ctx.emit("mul", [rate, ctx.emit("div", [v_new, h_sqrt])])])
        return [ctx.emit("mul", [_k(ctx, 1.0 - post, x_new), x_new]), v_new, h_new]
    return _per_tensor(ctx, node, 2, update)


@onnx_op(f"{DOMAIN}:Momentum")
def momentum(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    alpha, beta = node.float_attr("alpha", 0.0), node.float_attr("beta", 0.0)
    mode = node.attr("mode", "standard")
    if mode not in ("standard", "nesterov"):
        raise node.refuse(f"mode {mode!r} (standard or nesterov)")

    def update(ctx: ImportContext, r: str, t: str, x: str, g: str, accs: list[str]) -> list[str]:
        (v,) = accs
        g_reg = _regularized(ctx, node, x, g)
        # the gradient's coefficient is 1 at the first step (t == 0), beta after
        coeff = ctx.emit("where", [ctx.emit("gt", [t, _k(ctx, 0.0, t)]), _k(ctx, beta, t), _k(ctx, 1.0, t)])
        v_new = ctx.emit("add", [ctx.emit("mul", [_k(ctx, alpha, v), v]), ctx.emit("mul", [coeff, g_reg])])
        if mode == "standard":
            step = v_new
        else:
            step = ctx.emit("add", [g_reg, ctx.emit("mul", [_k(ctx, alpha, v_new), v_new])])
        return [ctx.emit("sub", [x, ctx.emit("mul", [r, step])]), v_new]
    return _per_tensor(ctx, node, 1, update)

