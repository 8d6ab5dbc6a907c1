"""TopK as a rank computation: each element's rank is how many elements beat it (ties: lower index first).

Ranks form a permutation, so output slot r picks the one element of rank r with a masked sum, which is
exact. The pairwise comparison costs n^2 per row, so long axes are refused rather than made slow silently.
A K computed from data (not a small input a value template could specialise on) makes the data-dependent
`top_k` op instead, whose output length is known when it has run.
"""

from __future__ import annotations

import math

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType
from edgerun.ir.specialize import MAX_VALUE_ELEMENTS
from edgerun.ir.staging import new_extent_symbol
from edgerun.ir.symbolic import upper_bound

MAX_PAIRWISE_ELEMENTS = 1 << 24


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
    """TopK with a K computed from data: the data-dependent `top_k` op, its output extent a fresh symbol
    bounded by the axis length (ir/staging.py runs the program in stages around it)."""
    k = ctx.emit("reshape", [ctx.cast(ctx.input(node, 1), DType.int64)], shape=[1])
    count = new_extent_symbol(ctx.graph, "topk", upper_bound(ctx.b.shape(x)[axis], ctx.graph.symbols))
    values, index = ctx.b.emit_multi("top_k", [x, k], axis=axis, largest=bool(node.attr("largest", 1)),
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
    if not 0 <= k <= n:
        raise ValueError(f"TopK k={k} outside [0, {n}]")
    outer = math.prod(shape) // max(n, 1)
    if outer * n * n > MAX_PAIRWISE_ELEMENTS:
        raise node.refuse(f"TopK over an axis of {n} (pairwise ranking would need {outer * n * n} elements)")
    largest = bool(node.attr("largest", 1))
    perm = [d for d in range(rank) if d != axis] + [axis]
    xt = ctx.emit("transpose", [x], perm=perm)
    lead = [shape[d] for d in perm[:-1]]
    xi = ctx.emit("reshape", [xt], shape=[*lead, n, 1])
    xj = ctx.emit("reshape", [xt], shape=[*lead, 1, n])
    beats = ctx.emit("gt" if largest else "lt", [xj, xi])
    ties = ctx.emit("eq", [xj, xi])
    earlier = ctx.b.const(np.arange(n)[None, :] < np.arange(n)[:, None])  # [i, j]: j < i
    wins = ctx.emit("logical_or", [beats, ctx.emit("logical_and", [ties, earlier])])
    ranks = ctx.emit("reduce_sum", [ctx.emit("cast", [wins], dtype="int64")], axes=[rank], keepdims=False)
    slots = ctx.b.const(np.arange(k, dtype=np.int64).reshape(k, 1))
    pick = ctx.emit("eq", [ctx.emit("reshape", [ranks], shape=[*lead, 1, n]), slots])  # [..., k, n]
    values = ctx.emit("reduce_sum", [ctx.emit("where", [pick, ctx.emit("reshape", [xt], shape=[*lead, 1, n]),
                                                        ctx.scalar(0, x)])], axes=[rank], keepdims=False)
    iota = ctx.b.const(np.arange(n, dtype=np.int64))
    index = ctx.emit("reduce_sum", [ctx.emit("where", [pick, iota, ctx.b.const(np.int64(0))])], axes=[rank],
                     keepdims=False)
    back = [perm.index(d) for d in range(rank)]
    return [ctx.emit("transpose", [values], perm=back), ctx.emit("transpose", [index], perm=back)]
