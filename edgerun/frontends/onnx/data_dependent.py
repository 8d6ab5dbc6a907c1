"""NonZero, Compress, Unique, NonMaxSuppression: ONNX ops whose output size depends on their input values.

Each becomes one data-dependent IR op (ir/ops/data_dependent_ops.py) whose output extent is a fresh symbol,
bounded by the most its input can give (ir/staging.py declares it); what follows computes with that
symbol like with an input's, and the runtime binds it when the node has run. Compress is nonzero on the
condition and a gather. With every input known at import time the node folds to a constant like any other.
"""

from __future__ import annotations

import math

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.staging import new_extent_symbol
from edgerun.ir.symbolic import Dim, upper_bound


def extent_symbol(ctx: ImportContext, node: OnnxNode, hint: str, most: Dim) -> str:
    """A fresh symbol for a data-dependent size of at most `most` (its largest value within the symbols'
    bounds). Refused inside a control-flow body, which is planned once for its node."""
    if ctx.in_body:
        raise node.refuse("an output size that depends on values, inside a control-flow body (a body is planned "
                          "once for its node; the program is split into stages only at its top level)")
    return new_extent_symbol(ctx.graph, hint, upper_bound(most, ctx.graph.symbols))


def _nonzero_indices(ctx: ImportContext, node: OnnxNode, x: str) -> str:
    """int64 [rank(x), count]: the indices of x's non-zero elements, the count a fresh symbol."""
    count = extent_symbol(ctx, node, "nonzero", math.prod(ctx.b.shape(x)))
    return ctx.emit("nonzero", [x], extent=count)


@onnx_op("NonZero")
def nonzero(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    if not ctx.b.shape(x):
        raise node.refuse("NonZero of a 0-d tensor")
    return [_nonzero_indices(ctx, node, x)]


@onnx_op("Compress")
def compress(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    condition = ctx.input(node, 1)
    if node.attr("axis") is None:
        x = ctx.emit("reshape", [x], shape=[math.prod(ctx.b.shape(x))])
        axis = 0
    else:
        axis = int(node.attr("axis")) % len(ctx.b.shape(x))
    (length,) = ctx.b.shape(condition)
    if isinstance(length, int) and isinstance(ctx.b.shape(x)[axis], int) and length > ctx.b.shape(x)[axis]:
        raise node.refuse(f"condition of length {length} is longer than axis {axis} ({ctx.b.shape(x)[axis]})")
    flat = _nonzero_indices(ctx, node, condition)
    index = ctx.emit("reshape", [flat], shape=[ctx.b.shape(flat)[1]])
    return [ctx.emit("gather", [x, index], axis=axis)]


@onnx_op("Unique")
def unique(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    shape = ctx.b.shape(x)
    axis = node.attr("axis")
    if axis is not None:
        axis = int(axis) % len(shape)
    most = math.prod(shape) if axis is None else shape[axis]
    count = extent_symbol(ctx, node, "unique", most)
    return list(ctx.b.emit_multi("unique", [x], axis=axis, sorted=bool(node.attr("sorted", 1)), extent=count))


@onnx_op("NonMaxSuppression")
def non_max_suppression(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    boxes, scores = ctx.input(node, 0), ctx.input(node, 1)
    float_type = ctx.b.dtype(boxes)
    # Absent inputs take ONNX's defaults, so the kernel reads its five inputs by position: no box kept per
    # class, IoU threshold 0, no score threshold (-inf keeps every score).
    limit = ctx.input(node, 2) if node.has_input(2) else ctx.b.const(np.zeros(1, np.int64))
    iou = ctx.input(node, 3) if node.has_input(3) else ctx.b.const(np.zeros(1), float_type)
    floor = ctx.input(node, 4) if node.has_input(4) else ctx.b.const(np.full(1, -np.inf), float_type)
    batch, boxes_n, _ = ctx.b.shape(boxes)
    classes = ctx.b.shape(scores)[1]
    count = extent_symbol(ctx, node, "selected", batch * classes * boxes_n)
    return [ctx.emit("non_max_suppression", [boxes, scores, limit, ctx.cast(iou, float_type),
                                             ctx.cast(floor, float_type)],
                     center_point_box=int(node.attr("center_point_box", 0)), extent=count)]
