"""Handlers for ATen ordering ops: topk, sort, argsort (a detector's top scores, a beam search's ranking).

All three are the IR's `top_k` composite (ir/ops/top_k_ops.py): sort is top_k with k the whole axis. Its
ranking breaks ties by the lower index first, which is torch's stable sort; torch's default (unstable) CPU
sort gives the same order. NaN ranks above every number (attr nan_largest), as torch orders it.
"""

from __future__ import annotations

from typing import Any

from edgerun.frontends.torch.context import ConvertContext, handles
from edgerun.ir.dtypes import DType


def _ranked(ctx: ConvertContext, x: str, dim: int, k: int | None, largest: bool) -> list[str]:
    """(values, int64 indices) of the k first elements along `dim` in the order `largest` says;
    k None: the whole axis."""
    b = ctx.b
    shape = b.shape(x)
    if not shape:  # a 0-d tensor sorts to itself, at index 0
        one = b.emit("reshape", [x], shape=[1])
        values, index = _ranked(ctx, one, 0, k, largest)
        return [b.emit("reshape", [values], shape=[]), b.emit("reshape", [index], shape=[])]
    axis = dim % len(shape)
    n = shape[axis]
    count = n if k is None else k
    if not isinstance(count, int):
        ctx.unsupported("sort along a dimension whose length is symbolic (export with that axis static)")
    src = ctx.cast(x, DType.int32) if b.dtype(x) is DType.bool else x
    values, index = b.emit_multi("top_k", [src], k=int(count), axis=axis, largest=largest, nan_largest=True)
    return [ctx.cast(values, b.dtype(x)), index]


@handles("aten.topk.default")
def _topk(ctx: ConvertContext, node: Any) -> list[str]:
    a = ctx.bind(node)
    k = ctx.size(a["k"])
    if not isinstance(k, int):
        ctx.unsupported("topk with a k computed from symbolic sizes")
    # sorted=False leaves the order to the implementation; the sorted order is one torch may return.
    return _ranked(ctx, ctx.v(a["self"]), int(a["dim"]), k, bool(a["largest"]))


@handles("aten.sort.default", "aten.sort.stable")
def _sort(ctx: ConvertContext, node: Any) -> list[str]:
    a = ctx.bind(node)
    return _ranked(ctx, ctx.v(a["self"]), int(a["dim"]), None, bool(a["descending"]))


@handles("aten.argsort.default", "aten.argsort.stable")
def _argsort(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    return _ranked(ctx, ctx.v(a["self"]), int(a["dim"]), None, bool(a["descending"]))[1]
