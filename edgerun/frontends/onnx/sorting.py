"""TopK: the IR's `top_k` composite (k known at import; ir/ops/top_k_ops.py ranks pairwise once shapes are
concrete, so a symbolic axis works), or, with a K computed from data (not a small input a value template
could specialise on), the data-dependent `top_k_dynamic` op, whose output length is known when it has run.
The pairwise ranking costs n^2 per row, so long axes are refused rather than made slow silently.
"""

from __future__ import annotations

import math

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.data_dependent import extent_symbol
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType
from edgerun.ir.ops.top_k_ops import MAX_PAIRWISE_ELEMENTS
from edgerun.ir.specialize import MAX_VALUE_ELEMENTS


def k_from_data(ctx: ImportContext, name: str) -> bool:
    """Whether K is computed at run time from data: from an input too large to specialise on (a count of
    scores above a threshold), or from no input at all. A K that is a small input (or computed from small
    inputs) makes a value template instead, specialised per K with the static decomposition."""
    if name in ctx.consts:
        return False
    behind = ctx.inputs_behind(name)
    small = all(ctx.graph.specs[n].is_static and math.prod(ctx.graph.specs[n].shape) <= MAX_VALUE_ELEMENTS
                for n in behind)
    return not behind or not small


def top_k_at_run_time(ctx: ImportContext, node: OnnxNode, x: str, axis: int) -> list[Out]:
    """TopK with a K computed from data: the data-dependent `top_k_dynamic` op, its output extent a fresh symbol
    bounded by the axis length (ir/staging.py runs the program in stages around it)."""
    k = ctx.emit("reshape", [ctx.cast(ctx.input(node, 1), DType.int64)], shape=[1])
    count = extent_symbol(ctx, node, "topk", ctx.b.shape(x)[axis])
    values, index = ctx.b.emit_multi("top_k_dynamic", [x, k], axis=axis, largest=bool(node.attr("largest", 1)),
                                     extent=count)
    return [values, index]


@onnx_op("TopK")
def top_k(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    shape = ctx.b.shape(x)
    rank = len(shape)
    axis = int(node.attr("axis", -1)) % rank
    if node.version < 10:
        k = int(node.attr("k"))
    elif k_from_data(ctx, node.inputs[1]):
        return top_k_at_run_time(ctx, node, x, axis)
    else:
        k_arr = ctx.static(node, 1, "K")
        assert k_arr is not None
        k = int(k_arr.reshape(-1)[0])
    n = shape[axis]
    if k < 0 or (isinstance(n, int) and k > n):
        raise ValueError(f"TopK k={k} outside [0, {n}]")
    if all(isinstance(d, int) for d in shape) and math.prod(shape) * n > MAX_PAIRWISE_ELEMENTS:
        raise node.refuse(f"TopK over an axis of {n} (pairwise ranking would need {math.prod(shape) * n} elements)")
    values, index = ctx.b.emit_multi("top_k", [x], k=k, axis=axis, largest=bool(node.attr("largest", 1)))
    return [values, index]
