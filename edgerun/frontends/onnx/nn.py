"""Linear algebra and normalisation ONNX ops: MatMul, Gemm, Einsum, the norms, Dropout at inference."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.einsum import einsum
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType
from edgerun.ir.symbolic import SymDim


def matmul_nd(ctx: ImportContext, a: str, b: str, op: str = "matmul", extra: Sequence[str] = ()) -> str:
    """numpy matmul semantics, including 1-D operands (our matmul ops need rank >= 2). `op` is "matmul" or
    another op with matmul's shapes (matmul_integer), `extra` its operands after the two matrices."""
    sa, sb = ctx.b.shape(a), ctx.b.shape(b)
    a2 = ctx.emit("reshape", [a], shape=[1, sa[0]]) if len(sa) == 1 else a
    b2 = ctx.emit("reshape", [b], shape=[sb[0], 1]) if len(sb) == 1 else b
    y = ctx.emit(op, [a2, b2, *extra])
    if len(sa) == 1 or len(sb) == 1:
        shp = list(ctx.b.shape(y))
        if len(sb) == 1:
            shp.pop(-1)
        if len(sa) == 1:
            shp.pop(-2 if len(sb) != 1 else -1)
        y = ctx.emit("reshape", [y], shape=shp)
    return y


@onnx_op("MatMul")
def matmul(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [matmul_nd(ctx, ctx.input(node, 0), ctx.input(node, 1))]


@onnx_op("Gemm")
def gemm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    a, b = ctx.input(node, 0), ctx.input(node, 1)
    if node.attr("transA", 0):
        a = ctx.emit("transpose", [a], perm=[1, 0])
    if node.attr("transB", 0):
        b = ctx.emit("transpose", [b], perm=[1, 0])
    y = ctx.emit("matmul", [a, b])
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = ctx.emit("mul", [y, ctx.scalar(alpha, y)])
    if node.has_input(2) and beta != 0.0:
        c = ctx.input(node, 2)
        if beta != 1.0:
            c = ctx.emit("mul", [c, ctx.scalar(beta, c)])
        y = ctx.emit("add", [y, c])
    return [y]


@onnx_op("Einsum")
def einsum_op(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    xs = [ctx.input(node, i) for i in range(len(node.inputs))]
    return [einsum(ctx, node, str(node.attr("equation")), xs)]


def _channel(ctx: ImportContext, v: str, rank: int) -> str:
    return ctx.emit("reshape", [v], shape=[ctx.b.shape(v)[0]] + [1] * (rank - 2))


@onnx_op("BatchNormalization")
def batch_norm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x, scale, bias, mean, var = (ctx.input(node, i) for i in range(5))
    eps = node.float_attr("epsilon", 1e-5)
    if not node.attr("training_mode", 0):
        if len([o for o in node.outputs if o]) > 1:
            raise node.refuse("the statistics outputs of the opset-9 training form")
        return [ctx.emit("batch_norm", [x, scale, bias, mean, var], eps=eps)]
    if node.version < 14:
        raise node.refuse("training mode before opset 14")
    # Training mode (opset 14+) is deterministic: normalise with the batch's own statistics (population
    # variance, over every axis but the channel's), and return the running statistics blended by momentum.
    axes = [a for a in range(len(ctx.b.shape(x))) if a != 1]
    batch_mean = ctx.emit("reduce_mean", [x], axes=axes, keepdims=False)
    centered = ctx.emit("sub", [x, _channel(ctx, batch_mean, len(ctx.b.shape(x)))])
    batch_var = ctx.emit("reduce_mean", [ctx.emit("mul", [centered, centered])], axes=axes, keepdims=False)
    y = ctx.emit("batch_norm", [x, scale, bias, batch_mean, batch_var], eps=eps)
    momentum = node.float_attr("momentum", 0.9)

    def blend(running: str, batch: str) -> str:
        return ctx.emit("add", [ctx.emit("mul", [running, ctx.scalar(momentum, running)]),
                                ctx.emit("mul", [batch, ctx.scalar(1.0 - momentum, batch)])])
    return [y, blend(mean, batch_mean), blend(var, batch_var)]


def _normalise(ctx: ImportContext, x: str, axes: list[int], eps: float) -> tuple[str, str, str]:
    """(normalised x, mean, 1/std) over axes, statistics kept with unit dims."""
    mean = ctx.emit("reduce_mean", [x], axes=axes, keepdims=True)
    centered = ctx.emit("sub", [x, mean])
    var = ctx.emit("reduce_mean", [ctx.emit("mul", [centered, centered])], axes=axes, keepdims=True)
    inv = ctx.emit("rsqrt", [ctx.emit("add", [var, ctx.scalar(eps, var)])])
    return ctx.emit("mul", [centered, inv]), mean, inv


@onnx_op("InstanceNormalization")
def instance_norm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    rank = len(ctx.b.shape(x))
    y, _, _ = _normalise(ctx, x, list(range(2, rank)), node.float_attr("epsilon", 1e-5))
    y = ctx.emit("mul", [y, _channel(ctx, ctx.input(node, 1), rank)])
    return [ctx.emit("add", [y, _channel(ctx, ctx.input(node, 2), rank)])]


@onnx_op("LayerNormalization")
def layer_norm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    rank = len(ctx.b.shape(x))
    axis = int(node.attr("axis", -1)) % rank
    if node.attr("stash_type", 1) != 1:
        raise node.refuse("stash_type other than float32")
    # stash_type float32 widens float16; float64 is normalised in float64, as ONNX Runtime and ONNX's reference
    # do (a float32 normalisation would give a float64 model single-precision answers).
    dtype = ctx.b.dtype(x)
    xf = ctx.cast(x, DType.float64 if dtype is DType.float64 else DType.float32)
    y, mean, inv = _normalise(ctx, xf, list(range(axis, rank)), node.float_attr("epsilon", 1e-5))
    y = ctx.cast(y, dtype)
    mean, inv = ctx.cast(mean, DType.float32), ctx.cast(inv, DType.float32)  # their ONNX type is the stash type
    y = ctx.emit("mul", [y, ctx.input(node, 1)])
    if node.has_input(2):
        y = ctx.emit("add", [y, ctx.input(node, 2)])
    return [y, mean, inv]


@onnx_op("LpNormalization")
def lp_norm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    axis, p = int(node.attr("axis", -1)), int(node.attr("p", 2))
    if p == 1:
        norm = ctx.emit("reduce_sum", [ctx.emit("abs", [x])], axes=[axis], keepdims=True)
    elif p == 2:
        norm = ctx.emit("sqrt", [ctx.emit("reduce_sum", [ctx.emit("mul", [x, x])], axes=[axis], keepdims=True)])
    else:
        raise node.refuse(f"p={p} (ONNX allows 1 or 2)")
    zero = ctx.emit("eq", [norm, ctx.scalar(0, norm)])
    return [ctx.emit("where", [zero, ctx.scalar(0, x), ctx.emit("div", [x, norm])])]


@onnx_op("Dropout")
def dropout(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    training = ctx.static(node, 2, "training_mode")
    # The ratio matters only in training mode; in inference dropout is the identity whatever its value.
    if training is not None and bool(training.reshape(-1)[0]):
        ratio = ctx.static(node, 1, "ratio")
        if ratio is None or float(ratio) != 0.0:
            raise node.refuse("training-mode dropout is random")
    shape = list(ctx.b.shape(x))
    y = ctx.emit("expand", [x], shape=shape)
    if any(isinstance(d, SymDim) for d in shape):
        return [y, ctx.emit("expand", [ctx.b.const(np.ones([1] * len(shape), dtype=bool))], shape=shape)]
    return [y, np.ones(shape, dtype=bool)]


@onnx_op("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    axes = list(range(2, len(ctx.b.shape(x))))
    op = "reduce_mean" if node.op_type == "GlobalAveragePool" else "reduce_max"
    return [ctx.emit(op, [x], axes=axes, keepdims=True)]


@onnx_op("LRN")
def lrn(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # Cross-channel sum of squares as a sum of channel-shifted slices of the zero-padded square.
    x = ctx.input(node, 0)
    size = int(node.attr("size"))
    alpha, beta, bias = node.float_attr("alpha", 1e-4), float(node.attr("beta", 0.75)), float(node.attr("bias", 1.0))
    shape = ctx.b.shape(x)
    c = shape[1]
    before, after = (size - 1) // 2, -(-(size - 1) // 2)
    pads = [[0, 0] for _ in shape]
    pads[1] = [before, after]
    sq = ctx.emit("pad", [ctx.emit("mul", [x, x])], pads=pads, mode="constant", value=0.0)
    total = ""
    for i in range(size):
        tap = ctx.emit("slice", [sq], starts=[i], ends=[i + c], axes=[1])
        total = ctx.emit("add", [total, tap]) if total else tap
    denom = ctx.emit("add", [ctx.emit("mul", [total, ctx.scalar(alpha / size, x)]), ctx.scalar(bias, x)])
    return [ctx.emit("div", [x, ctx.emit("pow", [denom, ctx.scalar(beta, x)])])]


MAX_DET_SIZE = 5  # Leibniz's formula: n! products of n entries


@onnx_op("Det")
def det(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """Determinants of [..., n, n] by Leibniz's formula, sum over permutations of sign * product of entries:
    exact arithmetic structure with no pivoting decisions, for n up to MAX_DET_SIZE."""
    x = ctx.input(node, 0)
    shape = ctx.b.shape(x)
    if len(shape) < 2 or shape[-1] != shape[-2] or not isinstance(shape[-1], int):
        raise node.refuse(f"Det of shape {shape} (square [..., n, n] matrices, n static)")
    if not ctx.b.dtype(x).is_float or ctx.b.dtype(x).is_narrow:
        raise node.refuse(f"Det of {ctx.b.dtype(x).value}")
    n = shape[-1]
    if n > MAX_DET_SIZE:
        raise node.refuse(f"Det of {n}x{n} matrices (Leibniz's formula, up to {MAX_DET_SIZE}x{MAX_DET_SIZE})")
    batch = list(shape[:-2])
    if n == 0:
        return [ctx.emit("expand", [ctx.scalar(1.0, x)], shape=batch)]
    entry = {(i, j): ctx.emit("reshape", [ctx.emit("slice", [x], starts=[i, j], ends=[i + 1, j + 1], axes=[-2, -1])],
                              shape=batch) for i in range(n) for j in range(n)}
    total = ""
    for perm in itertools.permutations(range(n)):
        term = entry[0, perm[0]]
        for i in range(1, n):
            term = ctx.emit("mul", [term, entry[i, perm[i]]])
        inversions = sum(perm[a] > perm[b] for a in range(n) for b in range(a + 1, n))
        if not total:
            total = term if inversions % 2 == 0 else ctx.emit("neg", [term])
        else:
            total = ctx.emit("sub" if inversions % 2 else "add", [total, term])
    return [total]
