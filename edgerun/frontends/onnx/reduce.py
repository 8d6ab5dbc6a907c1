"""ONNX reductions. Axes moved from an attribute to an input (ReduceSum at opset 13, the rest at 18)."""

from __future__ import annotations

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op


def reduce_axes(ctx: ImportContext, node: OnnxNode, rank: int) -> list[int] | None:
    """The axes to reduce, None for all; the empty list means 'no reduction' (noop_with_empty_axes)."""
    input_since = 13 if node.op_type == "ReduceSum" else 18
    if node.version >= input_since:
        arr = ctx.static(node, 1, "axes")
        axes = [] if arr is None else [int(a) for a in arr.reshape(-1)]
    else:
        axes = [int(a) for a in node.attr("axes", [])]
    if not axes:
        return [] if node.attr("noop_with_empty_axes", 0) else None
    for a in axes:
        if not -rank <= a < max(rank, 1):
            raise ValueError(f"axis {a} out of range for rank {rank}")
    return sorted({a % max(rank, 1) for a in axes})


def _empty_reduction(ctx: ImportContext, node: OnnxNode, x: str, identity: float) -> np.ndarray:
    """A reduction of an empty tensor is its identity element everywhere: a constant of the output shape."""
    shape = ctx.b.shape(x)
    axes = reduce_axes(ctx, node, len(shape))
    axes = list(range(len(shape))) if axes is None else axes
    keep = bool(node.attr("keepdims", 1))
    out = [1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes]
    dtype = ctx.b.dtype(x).np
    if dtype.kind == "b":
        return np.full(out, identity > 0, dtype=bool)
    if dtype.kind in "iu" and not np.isfinite(identity):
        identity = np.iinfo(dtype).min if identity < 0 else np.iinfo(dtype).max
    return np.full(out, identity, dtype=dtype)


EMPTY_IDENTITY = {"ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceLogSumExp": -np.inf, "ReduceProd": 1.0}


def _reduce(ctx: ImportContext, node: OnnxNode, op: str, x: str) -> str:
    axes = reduce_axes(ctx, node, len(ctx.b.shape(x)))
    if axes == []:
        return ctx.emit("expand", [x], shape=list(ctx.b.shape(x)))
    return ctx.emit(op, [x], axes=axes, keepdims=bool(node.attr("keepdims", 1)))


@onnx_op("ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean")
def reduce_plain(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    op = {"ReduceSum": "reduce_sum", "ReduceMax": "reduce_max", "ReduceMin": "reduce_min",
          "ReduceMean": "reduce_mean"}[node.op_type]
    x = ctx.input(node, 0)
    spec = ctx.b.spec(x)
    if op in ("reduce_max", "reduce_min") and spec.numel == 0:
        return [_empty_reduction(ctx, node, x, EMPTY_IDENTITY[node.op_type])]
    if op == "reduce_mean" and not spec.dtype.is_float:
        raise node.refuse(f"ReduceMean of {spec.dtype.value}")
    return [_reduce(ctx, node, op, x)]


@onnx_op("ReduceL1", "ReduceL2", "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")
def reduce_derived(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    op = node.op_type
    if op == "ReduceL1":
        return [_reduce(ctx, node, "reduce_sum", ctx.emit("abs", [x]))]
    if op in ("ReduceL2", "ReduceSumSquare"):
        total = _reduce(ctx, node, "reduce_sum", ctx.emit("mul", [x, x]))
        if op == "ReduceSumSquare":
            return [total]
        if not ctx.b.dtype(x).is_float:
            raise node.refuse("ReduceL2 of an integer tensor")
        return [ctx.emit("sqrt", [total])]
    if op == "ReduceLogSum":
        return [ctx.emit("log", [_reduce(ctx, node, "reduce_sum", x)])]
    if ctx.b.spec(x).numel == 0:
        return [_empty_reduction(ctx, node, x, EMPTY_IDENTITY[node.op_type])]
    peak = _reduce(ctx, node, "reduce_max", x)
    axes = reduce_axes(ctx, node, len(ctx.b.shape(x)))
    keep_peak = peak if node.attr("keepdims", 1) or axes == [] else \
        ctx.emit("reduce_max", [x], axes=axes, keepdims=True)
    total = _reduce(ctx, node, "reduce_sum", ctx.emit("exp", [ctx.emit("sub", [x, keep_peak])]))
    return [ctx.emit("add", [ctx.emit("log", [total]), peak])]


@onnx_op("ReduceProd")
def reduce_prod(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # No product primitive: |x| multiplies as exp(sum(log|x|)), the sign from the parity of negatives,
    # and any zero forces 0. Accurate to a few ulps per factor in fp32; integers are refused.
    x = ctx.input(node, 0)
    if not ctx.b.dtype(x).is_float:
        raise node.refuse("ReduceProd of an integer tensor")
    if ctx.b.spec(x).numel == 0:
        return [_empty_reduction(ctx, node, x, EMPTY_IDENTITY[node.op_type])]
    logs = ctx.emit("log", [ctx.emit("abs", [x])])
    mag = ctx.emit("exp", [_reduce(ctx, node, "reduce_sum", logs)])
    negs = _reduce(ctx, node, "reduce_sum", ctx.emit("cast", [ctx.emit("lt", [x, ctx.scalar(0, x)])],
                                                     dtype="int32"))
    odd = ctx.emit("eq", [ctx.emit("mod", [negs, ctx.scalar(2, negs)]), ctx.scalar(1, negs)])
    signed = ctx.emit("where", [odd, ctx.emit("neg", [mag]), mag])
    zeros = _reduce(ctx, node, "reduce_max", ctx.emit("cast", [ctx.emit("eq", [x, ctx.scalar(0, x)])],
                                                      dtype="int32"))
    return [ctx.emit("where", [ctx.emit("gt", [zeros, ctx.scalar(0, zeros)]), ctx.scalar(0, x), signed])]


@onnx_op("ArgMax", "ArgMin")
def arg_reduce(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    return [ctx.emit(node.op_type.lower(), [x], axis=int(node.attr("axis", 0)),
                     keepdims=bool(node.attr("keepdims", 1)),
                     select_last_index=bool(node.attr("select_last_index", 0)))]

