"""Handlers for ATen element-wise indexing: gather (torch.gather, a detector picking its top boxes),
diagonal, and the adding scatters (IR scatter_add): scatter_add, and index_put with accumulate (what
torch.export makes of index_add and `x[i] += v`).

torch.gather reads input[..., index[i], ...] along one axis for every element of `index`, whose other axes
may be shorter than the input's. It runs as one IR gather on the flattened input with flat element
indices: the index (negative ones wrapped) times the axis's stride, plus a constant grid of the other
axes' offsets. The grid needs static shapes.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgerun.frontends.torch.context import ConvertContext, handles
from edgerun.ir.dtypes import DType


@handles("aten.gather.default")
def _gather(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x, index = ctx.v(a["self"]), ctx.cast(ctx.v(a["index"]), DType.int64)
    b = ctx.b
    shape, ishape = b.shape(x), b.shape(index)
    if not all(isinstance(d, int) for d in (*shape, *ishape)):
        ctx.unsupported("gather over symbolic sizes")
    if not shape:  # a 0-d input: every index is 0 (or -1), the output has the index's shape
        x, shape = b.emit("reshape", [x], shape=[1]), (1,)
    axis = int(a["dim"]) % len(shape)
    if len(ishape) != len(shape):
        index = b.emit("reshape", [index], shape=[1] * len(shape))
    y = b.emit("gather", [b.emit("reshape", [x], shape=[math.prod(shape)]), _flat_index(ctx, index, shape, axis)],
               axis=0)
    out = ctx.out_shape(node)
    return y if b.shape(y) == out else b.emit("reshape", [y], shape=list(out))


def _flat_index(ctx: ConvertContext, index: str, shape: tuple[int, ...], axis: int) -> str:
    """Element indices into the flattened tensor of `shape` for an index tensor along `axis` (torch.gather's
    and torch.scatter_add's convention: the index's other axes address the same positions)."""
    b = ctx.b
    ishape = b.shape(index)
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    grid = np.zeros(ishape, dtype=np.int64)
    for d in range(len(ishape)):
        if d != axis:
            view = [1] * len(ishape)
            view[d] = ishape[d]
            grid = grid + np.arange(ishape[d], dtype=np.int64).reshape(view) * strides[d]
    wrapped = b.emit("where", [b.binary("lt", index, b.scalar(0, index)),
                               b.binary("add", index, b.scalar(shape[axis], index)), index])
    return b.binary("add", b.binary("mul", wrapped, b.scalar(strides[axis], wrapped)), b.const(grid))


def index_put_accumulate(ctx: ConvertContext, a: dict[str, Any], x: str) -> str:
    """`x.index_put_(indices, values, accumulate=True)` (how torch.export writes x.index_add and x[:, i] += v)
    with one index tensor after any number of full slices: values, broadcast to gather's output shape, summed
    in at the rows the index names: one IR scatter_add (repeated indices accumulate)."""
    b = ctx.b
    indices = list(a["indices"])
    used = [i for i, t in enumerate(indices) if t is not None]
    if len(used) != 1:
        ctx.unsupported("index_put with accumulate over more than one index tensor")
    axis = used[0]
    index = ctx.v(indices[axis])
    if b.dtype(index) not in (DType.int32, DType.int64):
        ctx.unsupported("index_put with accumulate and a boolean mask (its result depends on the data)")
    shape = b.shape(x)
    taken = [*shape[:axis], *b.shape(index), *shape[axis + 1:]]
    values = ctx.operand(a["values"], b.dtype(x))
    if list(b.shape(values)) != taken:
        values = b.emit("expand", [values], shape=taken)
    return b.emit("scatter_add", [x, index, values], axis=axis)


@handles("aten.scatter_add.default")
def _scatter_add(ctx: ConvertContext, node: Any) -> str:
    """self.scatter_add(dim, index, src): src[i][j] added at self[index[i][j]][j] (dim 0), for the positions
    the index covers (src may be larger): one IR scatter_add over the flattened tensor at flat indices."""
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    x, src = ctx.operand(a["self"], dtype), ctx.operand(a["src"], dtype)
    index = ctx.cast(ctx.v(a["index"]), DType.int64)
    b = ctx.b
    shape, ishape, sshape = b.shape(x), b.shape(index), b.shape(src)
    if not all(isinstance(d, int) for d in (*shape, *ishape, *sshape)):
        ctx.unsupported("scatter_add over symbolic sizes")
    if not shape and not ishape and not sshape:  # 0-d: one element, added at index 0 (or -1)
        x, index, src = (b.emit("reshape", [v], shape=[1]) for v in (x, index, src))
        shape, ishape, sshape = (1,), (1,), (1,)
    if len(ishape) != len(shape) or len(sshape) != len(shape):
        ctx.unsupported("scatter_add with operands of different ranks")
    axis = int(a["dim"]) % len(shape)
    if tuple(sshape) != tuple(ishape):  # the index covers a leading block of src
        src = b.emit("slice", [src], starts=[0] * len(ishape), ends=list(ishape), axes=list(range(len(ishape))))
    flat = b.emit("scatter_add", [b.emit("reshape", [x], shape=[math.prod(shape)]),
                                  _flat_index(ctx, index, shape, axis), src], axis=0)
    return b.emit("reshape", [flat], shape=list(ctx.out_shape(node)))


@handles("aten.diagonal.default", "aten.diagonal_copy.default")
def _diagonal(ctx: ConvertContext, node: Any) -> str:
    """torch.diagonal: the two axes move last and merge, and one gather takes the (row, row + offset)
    elements (offset < 0: (col - offset, col)); the diagonal becomes the last axis, as in torch."""
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    b = ctx.b
    shape = b.shape(x)
    if not all(isinstance(d, int) for d in shape):
        ctx.unsupported("diagonal over symbolic sizes")
    rank = len(shape)
    d1, d2, offset = int(a["dim1"]) % rank, int(a["dim2"]) % rank, int(a["offset"])
    rest = [i for i in range(rank) if i not in (d1, d2)]
    n1, n2 = shape[d1], shape[d2]
    moved = b.emit("transpose", [x], perm=[*rest, d1, d2])
    merged = b.emit("reshape", [moved], shape=[*(shape[i] for i in rest), n1 * n2])
    rows = np.arange(max(0, min(n1, n2 - offset) if offset >= 0 else min(n1 + offset, n2)), dtype=np.int64)
    flat = (rows * n2 + rows + offset) if offset >= 0 else ((rows - offset) * n2 + rows)
    return b.emit("gather", [merged, b.const(flat)], axis=len(rest))
