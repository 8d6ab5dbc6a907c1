"""Handlers for ATen ops whose result depends only on shapes: full, zeros, arange, scalar_tensor, tril/triu,
and ops that are no-ops in an exported inference graph."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgerun.frontends.torch.context import ConvertContext, handles
from edgerun.ir.dtypes import DType
from edgerun.ir.symbolic import is_symbolic, upper_bound


def _filled(ctx: ConvertContext, node: Any, value: Any) -> str:
    dtype = ctx.out_dtype(node)
    shape = ctx.out_shape(node)
    if any(is_symbolic(d) for d in shape):  # a size known at run time: broadcast one element to it
        return ctx.b.emit("expand", [ctx.b.const(np.full((1,) * len(shape), value), dtype)],
                          shape=list(shape))
    return ctx.b.const(np.full(shape, value), dtype)


@handles("aten.full.default", "aten.full_like.default", "aten.new_full.default", "aten.fill.Scalar")
def _full(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    return _filled(ctx, node, a.get("fill_value", a.get("value")))


@handles("aten.zeros.default", "aten.zeros_like.default", "aten.new_zeros.default")
def _zeros(ctx: ConvertContext, node: Any) -> str:
    return _filled(ctx, node, 0)


@handles("aten.ones.default", "aten.ones_like.default", "aten.new_ones.default")
def _ones(ctx: ConvertContext, node: Any) -> str:
    return _filled(ctx, node, 1)


@handles("aten.scalar_tensor.default")
def _scalar_tensor(ctx: ConvertContext, node: Any) -> str:
    return _filled(ctx, node, node.args[0])


@handles("aten.arange.start_step", "aten.arange.default", "aten.arange.start")
def _arange(ctx: ConvertContext, node: Any) -> str:
    import torch

    # torch's own arange on concrete numbers is the definition (its float accumulation differs from numpy's).
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    args = [ctx.size(a[n]) if ctx.is_tensor(a[n]) else a[n] for n in ("start", "end", "step")
            if n in a and a[n] is not None]
    if not any(is_symbolic(v) for v in args):
        return ctx.b.const(torch.arange(*args, dtype=ctx.torch_dtype(dtype)).numpy())
    # A run-time length (arange(seq)): the constant for the largest length the bounds allow, sliced to
    # the length of this call; every shorter arange is a prefix of the longest.
    length = ctx.out_shape(node)[0]
    widest = [upper_bound(v, ctx.graph.symbols) if is_symbolic(v) else v for v in args]
    values = ctx.b.const(torch.arange(*widest, dtype=ctx.torch_dtype(dtype)).numpy())
    return ctx.b.emit("slice", [values], starts=[0], ends=[length], axes=[0])


@handles("aten.tril.default", "aten.triu.default")
def _tri(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    shape = ctx.b.shape(x)
    if len(shape) < 2:
        ctx.unsupported("tril/triu of a tensor with fewer than 2 dimensions")
    fn = np.tril if "tril" in str(node.target) else np.triu
    keep = fn(np.ones(shape[-2:], dtype=bool), k=int(a["diagonal"]))
    return ctx.b.emit("where", [ctx.b.const(keep), x, ctx.b.scalar(0, x)])


@handles("aten.copy.default")
def _copy(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    src = ctx.operand(a["src"], ctx.out_dtype(node))
    shape = ctx.out_shape(node)
    return src if ctx.b.shape(src) == shape else ctx.b.emit("expand", [src], shape=list(shape))


@handles("aten._to_copy.default", "aten.to.dtype", "aten._to_dim_order_copy.default")
def _to_copy(ctx: ConvertContext, node: Any) -> str:
    return ctx.cast(ctx.v(node.args[0]), ctx.out_dtype(node))


@handles("aten.index_select.default")
def _index_select(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x, index = ctx.v(a["self"]), ctx.v(a["index"])
    shape = ctx.b.shape(x)
    if not shape:
        ctx.unsupported("index_select on a 0-d tensor")
    index_shape = ctx.b.shape(index)
    if len(index_shape) == 0:
        index = ctx.b.emit("reshape", [index], shape=[1])
    return ctx.b.emit("gather", [x, index], axis=int(a["dim"]) % len(shape))


@handles("aten.index.Tensor")
def _index(ctx: ConvertContext, node: Any) -> str:
    """Advanced indexing as one gather: the indexed axes move to the front and merge into one, and the
    broadcast index tensors combine into a flat index over that merged axis."""
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    shape = list(ctx.b.shape(x))
    indices = list(a["indices"])
    used = [i for i, t in enumerate(indices) if t is not None]
    if not used:
        return x
    idx_values = [ctx.v(indices[i]) for i in used]
    if any(ctx.b.dtype(v).value not in ("int32", "int64") for v in idx_values):
        ctx.unsupported("boolean-mask indexing (its result shape depends on the data)")
    b = ctx.b
    if len(used) == 1:
        y = b.emit("gather", [x, idx_values[0]], axis=used[0])
        return y
    rest = [i for i in range(len(shape)) if i not in used]
    moved = b.emit("transpose", [x], perm=used + rest)
    merged_size = math.prod([shape[i] for i in used])
    merged = b.emit("reshape", [moved], shape=[merged_size] + [shape[i] for i in rest])
    flat = ""
    stride = 1
    for axis, v in reversed(list(zip(used, idx_values))):
        v = ctx.cast(v, DType.int64)
        size = shape[axis]
        wrapped = b.emit("where", [b.binary("lt", v, b.scalar(0, v)),
                                   b.binary("add", v, ctx.dim_scalar(size, DType.int64)), v])
        term = b.binary("mul", wrapped, ctx.dim_scalar(stride, DType.int64)) if stride != 1 else wrapped
        flat = b.binary("add", flat, term) if flat else term
        stride *= size
    y = b.emit("gather", [merged, flat], axis=0)
    batch_rank = len(b.shape(flat))
    adjacent = used == list(range(used[0], used[-1] + 1))
    if adjacent and used[0] > 0:
        # torch keeps the broadcast index axes where the indexed axes were when they are adjacent.
        lead = list(range(batch_rank, batch_rank + used[0]))
        perm = lead + list(range(batch_rank)) + list(range(batch_rank + used[0], len(b.shape(y))))
        y = b.emit("transpose", [y], perm=perm)
    return y


_NO_OPS = ("aten._assert_tensor_metadata.default", "aten._assert_scalar.default",
           "aten.sym_constrain_range_for_size.default", "aten._assert_async.msg")


@handles(*_NO_OPS)
def _no_op(ctx: ConvertContext, node: Any) -> None:
    return None
