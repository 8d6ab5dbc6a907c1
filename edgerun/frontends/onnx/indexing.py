"""Index-driven ONNX ops built from gather, comparisons against constant index grids, and matmul.

GatherElements/GatherND compute flat element indices and run one gather on the flattened data. The Scatter
ops likewise address rows of the flattened data: reduction='add' is one IR scatter_add (gather's transpose);
the others have no primitive: a [positions x updates] match mask selects updates with one matmul, which is
exact because each output picks at most one update.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.frontends.onnx.symfold import is_symbolic
from edgerun.ir.dtypes import DType
from edgerun.ir.symbolic import SymDim


@onnx_op("Gather")
def gather(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [ctx.emit("gather", [ctx.input(node, 0), ctx.input(node, 1)], axis=int(node.attr("axis", 0)))]


def _wrap(ctx: ImportContext, idx: str, size: str | int) -> str:
    """Negative indices count from the end."""
    idx = ctx.cast(idx, DType.int64)
    n = ctx.scalar(size, idx) if isinstance(size, int) else size
    return ctx.emit("where", [ctx.emit("lt", [idx, ctx.scalar(0, idx)]), ctx.emit("add", [idx, n]), idx])


def _element_linear(ctx: ImportContext, idx: str, shape: tuple[int, ...], axis: int) -> str:
    """Flat indices into a tensor of `shape` for GatherElements/ScatterElements indices along axis."""
    ishape = ctx.b.shape(idx)
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    grid = np.zeros(ishape, dtype=np.int64)
    for d in range(len(ishape)):
        if d != axis:
            view = [1] * len(ishape)
            view[d] = ishape[d]
            grid = grid + np.arange(ishape[d], dtype=np.int64).reshape(view) * strides[d]
    scaled = ctx.emit("mul", [_wrap(ctx, idx, shape[axis]), ctx.b.const(np.int64(strides[axis]))])
    return ctx.emit("add", [scaled, ctx.b.const(grid)])


@onnx_op("GatherElements")
def gather_elements(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    data, idx = ctx.input(node, 0), ctx.input(node, 1)
    shape = ctx.b.shape(data)
    axis = int(node.attr("axis", 0)) % len(shape)
    flat = ctx.emit("reshape", [data], shape=[math.prod(shape)])
    return [ctx.emit("gather", [flat, _element_linear(ctx, idx, shape, axis)], axis=0)]


def _nd_linear(ctx: ImportContext, node: OnnxNode, data: str, idx: str) -> tuple[str, str, list[int]]:
    """(data as [B*P, rest...], flat row index [B, M], output prefix shape) for GatherND/ScatterND."""
    shape, ishape = ctx.b.shape(data), ctx.b.shape(idx)
    bd, k = int(node.attr("batch_dims", 0)), ishape[-1]
    batch, lead = shape[:bd], shape[bd:bd + k]
    nb, p = math.prod(batch), math.prod(lead)
    m = math.prod(ishape[bd:-1])
    rows = ctx.emit("reshape", [data], shape=[nb * p, *shape[bd + k:]])
    idx3 = ctx.emit("reshape", [_wrap(ctx, idx, _sizes(ctx, lead))], shape=[nb, m, k])
    strides = _sizes(ctx, [math.prod(lead[i + 1:]) for i in range(k)])
    lin = ctx.emit("reduce_sum", [ctx.emit("mul", [idx3, strides])], axes=[2], keepdims=False)
    if nb != 1:
        if not (isinstance(nb, int) and isinstance(p, int)):
            raise node.refuse("batch_dims over symbolic sizes")
        lin = ctx.emit("add", [lin, ctx.b.const((np.arange(nb, dtype=np.int64) * p).reshape(nb, 1))])
    return rows, lin, [*ishape[:-1]]


def _sizes(ctx: ImportContext, sizes: Sequence[Any]) -> str:
    """int64 [len(sizes)]: a constant, or computed at run time where a size is symbolic (the data's rows
    selected by a NonZero, a symbolic batch), one dim_value per symbol."""
    if all(isinstance(d, int) for d in sizes):
        return ctx.b.const(np.asarray(sizes, dtype=np.int64))
    return ctx.value_of_sizes(np.asarray(sizes, dtype=object))


@onnx_op("GatherND")
def gather_nd(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    data, idx = ctx.input(node, 0), ctx.input(node, 1)
    shape, k = ctx.b.shape(data), ctx.b.shape(idx)[-1]
    bd = int(node.attr("batch_dims", 0))
    rows, lin, prefix = _nd_linear(ctx, node, data, idx)
    y = ctx.emit("gather", [rows, lin], axis=0)
    return [ctx.emit("reshape", [y], shape=[*prefix, *shape[bd + k:]])]


MAX_MUL_UPDATES = 1024  # a multiplying scatter emits one multiply per update


def _scatter(ctx: ImportContext, node: OnnxNode, rows: str, lin: str, updates: str) -> str:
    """rows [P, R] with updates [M, R] written at flat row indices lin [M]."""
    reduction = node.attr("reduction", "none")
    if reduction not in ("none", "add", "max", "min", "mul"):
        raise node.refuse(f"reduction={reduction!r}")
    p = ctx.b.shape(rows)[0]
    dtype = ctx.b.dtype(rows)
    if reduction == "add" and dtype is not DType.bool and not dtype.is_narrow:
        return ctx.emit("scatter_add", [rows, lin, updates], axis=0)
    hit = ctx.emit("eq", [ctx.b.const(np.arange(p, dtype=np.int64).reshape(p, 1)),
                          ctx.emit("reshape", [lin], shape=[1, ctx.b.spec(lin).numel])])
    if reduction == "mul":
        # No product primitive: each update multiplies in turn, in index order as ONNX's reference applies
        # them (the rounding of a float product depends on the order), 1 where it does not land.
        m, r = ctx.b.shape(updates)
        if m > MAX_MUL_UPDATES:
            raise node.refuse(f"reduction='mul' with {m} updates (each is one multiply; at most {MAX_MUL_UPDATES})")
        out = rows
        for i in range(m):
            lands = ctx.emit("slice", [hit], starts=[i], ends=[i + 1], axes=[1])
            row = ctx.emit("slice", [updates], starts=[i], ends=[i + 1], axes=[0])
            out = ctx.emit("mul", [out, ctx.emit("where", [lands, row, ctx.scalar(1, row)])])
        return out
    if reduction in ("max", "min"):
        # [P, M, R]: each position's matching updates, the rest replaced by the reduction's identity.
        m, r = ctx.b.shape(updates)
        big = np.inf if dtype.is_float else np.iinfo(dtype.np).max
        ident = ctx.b.const(-big if reduction == "max" else big, dtype)
        sel = ctx.emit("where", [ctx.emit("reshape", [hit], shape=[p, m, 1]),
                                 ctx.emit("reshape", [updates], shape=[1, m, r]), ident])
        best = ctx.emit(f"reduce_{reduction}", [sel], axes=[1], keepdims=False)
        merged = ctx.emit("maximum" if reduction == "max" else "minimum", [rows, best])
        any_hit = ctx.emit("reshape", [ctx.emit("reduce_max", [ctx.cast(hit, DType.int32)], axes=[1], keepdims=False)],
                           shape=[p, 1])
        return ctx.emit("where", [ctx.emit("gt", [any_hit, ctx.b.const(np.int32(0))]), merged, rows])
    work = DType.float32 if dtype in (DType.float16, DType.bool) else dtype
    mask = ctx.cast(hit, work)
    picked = ctx.emit("matmul", [mask, ctx.cast(updates, work)])
    if reduction == "add":
        return ctx.cast(ctx.emit("add", [ctx.cast(rows, work), picked]), dtype)
    any_hit = ctx.emit("gt", [ctx.emit("reduce_sum", [mask], axes=[1], keepdims=True), ctx.scalar(0, mask)])
    return ctx.emit("where", [any_hit, ctx.cast(picked, dtype), rows])


@onnx_op("ScatterND")
def scatter_nd(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    data, idx, upd = (ctx.input(node, i) for i in range(3))
    shape = ctx.b.shape(data)
    rows, lin, _ = _nd_linear(ctx, node, data, idx)
    r = math.prod(ctx.b.shape(rows)[1:])
    rows2 = ctx.emit("reshape", [rows], shape=[ctx.b.shape(rows)[0], r])
    m = ctx.b.spec(lin).numel
    upd2 = ctx.emit("reshape", [upd], shape=[m, r])
    out = _scatter(ctx, node, rows2, ctx.emit("reshape", [lin], shape=[m]), upd2)
    return [ctx.emit("reshape", [out], shape=list(shape))]


@onnx_op("ScatterElements", "Scatter")
def scatter_elements(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    data, idx, upd = (ctx.input(node, i) for i in range(3))
    shape = ctx.b.shape(data)
    axis = int(node.attr("axis", 0)) % len(shape)
    lin = _element_linear(ctx, idx, shape, axis)
    m = ctx.b.spec(lin).numel
    rows = ctx.emit("reshape", [data], shape=[math.prod(shape), 1])
    out = _scatter(ctx, node, rows, ctx.emit("reshape", [lin], shape=[m]),
                   ctx.emit("reshape", [upd], shape=[m, 1]))
    return [ctx.emit("reshape", [out], shape=list(shape))]


@onnx_op("OneHot")
def one_hot(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    idx = ctx.input(node, 0)
    depth_arr = ctx.static(node, 1, "depth")
    assert depth_arr is not None
    depth = int(depth_arr.reshape(-1)[0])
    values = ctx.input(node, 2)
    ishape = ctx.b.shape(idx)
    rank = len(ishape) + 1
    axis = int(node.attr("axis", -1)) % rank
    idx = _wrap(ctx, idx, depth)
    idx = ctx.emit("reshape", [idx], shape=[*ishape[:axis], 1, *ishape[axis:]])
    view = [1] * rank
    view[axis] = depth
    hit = ctx.emit("eq", [idx, ctx.b.const(np.arange(depth, dtype=np.int64).reshape(view))])
    off = ctx.emit("slice", [values], starts=[0], ends=[1], axes=[0])
    on = ctx.emit("slice", [values], starts=[1], ends=[2], axes=[0])
    return [ctx.emit("where", [hit, on, off])]


@onnx_op("Trilu")
def trilu(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    n, m = ctx.b.shape(x)[-2:]
    upper = bool(node.attr("upper", 1))
    k_arr = ctx.const(node.inputs[1]) if node.has_input(1) else np.zeros(1, dtype=np.int64)
    if k_arr is not None and not is_symbolic(k_arr):
        ones = np.ones((n, m), dtype=bool)
        k = int(k_arr.reshape(-1)[0])
        mask = ctx.b.const(np.triu(ones, k) if upper else np.tril(ones, k))
    else:
        # A diagonal offset k known only at run time: keep column - row >= k (upper) or <= k (lower).
        diagonal = ctx.b.const(np.arange(m, dtype=np.int64)[None, :] - np.arange(n, dtype=np.int64)[:, None])
        offset = ctx.emit("reshape", [ctx.cast(ctx.input(node, 1), DType.int64)], shape=[])
        mask = ctx.emit("ge" if upper else "le", [diagonal, offset])
    return [ctx.emit("where", [mask, x, ctx.scalar(0, x)])]


def _running_axis(ctx: ImportContext, node: OnnxNode) -> tuple[str, tuple[int, ...], int, int]:
    """CumSum's and CumProd's operand, its shape, the (static) axis input normalised, and that axis' length."""
    x = ctx.input(node, 0)
    shape = ctx.b.shape(x)
    axis_arr = ctx.static(node, 1, "axis")
    assert axis_arr is not None
    axis = int(axis_arr.reshape(-1)[0]) % len(shape)
    return x, shape, axis, shape[axis]


@onnx_op("CumSum")
def cumsum(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # A running sum along an axis is a matmul with a triangular 0/1 matrix (exact for integers).
    x, shape, axis, n = _running_axis(ctx, node)
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    exclusive, reverse = bool(node.attr("exclusive", 0)), bool(node.attr("reverse", 0))
    tri = (i > j if exclusive else i >= j) if reverse else (i < j if exclusive else i <= j)
    perm = [d for d in range(len(shape)) if d != axis] + [axis]
    xt = ctx.emit("transpose", [x], perm=perm)
    flat = ctx.emit("reshape", [xt], shape=[math.prod(shape) // max(n, 1), n])
    y = ctx.emit("matmul", [flat, ctx.b.const(tri, ctx.b.dtype(x))])
    y = ctx.emit("reshape", [y], shape=[shape[d] for d in perm])
    inv = [perm.index(d) for d in range(len(shape))]
    return [ctx.emit("transpose", [y], perm=inv)]


# A running product has no matmul form; it is unrolled into one multiply per position, so the axis is capped.
MAX_CUMPROD_LENGTH = 256


@onnx_op("CumProd")
def cumprod(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # Position by position along the axis, each product one multiply of the previous one: numpy.cumprod's
    # order, exact for integers (wrapping like them) and one rounding per step for floats.
    x, shape, axis, n = _running_axis(ctx, node)
    if isinstance(n, SymDim) or n > MAX_CUMPROD_LENGTH:
        raise node.refuse(f"axis of length {n} (CumProd is unrolled, up to {MAX_CUMPROD_LENGTH} positions)")
    if n == 0:
        return [x]
    exclusive, reverse = bool(node.attr("exclusive", 0)), bool(node.attr("reverse", 0))
    one = ctx.b.const(np.ones([1 if d == axis else s for d, s in enumerate(shape)]), ctx.b.dtype(x))
    outs: dict[int, str] = {}
    acc = ""
    for k in (reversed(range(n)) if reverse else range(n)):
        piece = ctx.emit("slice", [x], starts=[k], ends=[k + 1], axes=[axis])
        if exclusive:
            outs[k] = acc or one
        acc = ctx.emit("mul", [acc, piece]) if acc else piece
        if not exclusive:
            outs[k] = acc
    parts = [outs[k] for k in range(n)]
    return [parts[0] if n == 1 else ctx.emit("concat", parts, axis=axis)]




@onnx_op("ReverseSequence")
def reverse_sequence(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # Element (b, t) reads (b, len[b] - 1 - t) for t < len[b] and itself after: one GatherElements.
    x, lens = ctx.input(node, 0), ctx.cast(ctx.input(node, 1), DType.int64)
    shape = ctx.b.shape(x)
    t_axis, b_axis = int(node.attr("time_axis", 0)), int(node.attr("batch_axis", 1))
    t_view, b_view = [1] * len(shape), [1] * len(shape)
    t_view[t_axis], b_view[b_axis] = shape[t_axis], shape[b_axis]
    t = ctx.b.const(np.arange(shape[t_axis], dtype=np.int64).reshape(t_view))
    n = ctx.emit("reshape", [lens], shape=b_view)
    flipped = ctx.emit("sub", [ctx.emit("sub", [n, ctx.b.const(np.int64(1))]), t])
    src = ctx.emit("where", [ctx.emit("lt", [t, n]), flipped, t])
    src = ctx.emit("expand", [src], shape=list(shape))
    flat = ctx.emit("reshape", [x], shape=[math.prod(shape)])
    return [ctx.emit("gather", [flat, _element_linear(ctx, src, shape, t_axis)], axis=0)]


@onnx_op("MaxUnpool")
def max_unpool(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x, idx = ctx.input(node, 0), ctx.input(node, 1)
    shape = ctx.b.shape(x)
    kernel = [int(k) for k in node.attr("kernel_shape")]
    n = len(kernel)
    strides = [int(s) for s in node.attr("strides", [1] * n)]
    pads = [int(p) for p in node.attr("pads", [0] * 2 * n)]
    out_arr = ctx.static(node, 2, "output_shape")
    out_shape = [*shape[:2], *[(d - 1) * s + k - pads[i] - pads[i + n]
                               for i, (d, s, k) in enumerate(zip(shape[2:], strides, kernel))]]
    # Indices address the default output; a larger output_shape pads it at the end (as the reference does).
    final = [int(d) for d in out_arr.reshape(-1)] if out_arr is not None else out_shape
    if any(f < o for f, o in zip(final, out_shape)):
        raise node.refuse(f"output_shape {final} smaller than the unpooled shape {out_shape}")
    total = math.prod(out_shape)
    m = ctx.b.spec(x).numel
    rows = ctx.b.const(np.zeros((total, 1)), ctx.b.dtype(x))
    out = _scatter(ctx, node, rows, ctx.emit("reshape", [ctx.cast(idx, DType.int64)], shape=[m]),
                   ctx.emit("reshape", [x], shape=[m, 1]))
    out = ctx.emit("reshape", [out], shape=out_shape)
    if final != out_shape:
        out = ctx.emit("pad", [out], pads=[[0, f - o] for f, o in zip(final, out_shape)], mode="constant", value=0)
    return [out]


@onnx_op("TensorScatter")
def tensor_scatter(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """A KV-cache write: update [B, ..., S, ...] into past [B, ..., L, ...] along `axis`, at each batch row's
    write index (wrapping modulo L in circular mode). Positions are compared with the run-time indices: a
    one-hot [B, L, S] picks each cache position's update by a matmul, as _scatter does."""
    past, update = ctx.input(node, 0), ctx.input(node, 1)
    shape, ushape = ctx.b.shape(past), ctx.b.shape(update)
    rank = len(shape)
    axis = int(node.attr("axis", -2)) % rank
    mode = node.attr("mode", "linear")
    if mode not in ("linear", "circular") or axis == 0:
        raise node.refuse(f"mode {mode!r} on axis {axis} (linear or circular, not the batch axis)")
    if not all(isinstance(d, int) for d in (*shape, *ushape)):
        raise node.refuse("TensorScatter over symbolic sizes")
    b, length, seq = shape[0], shape[axis], ushape[axis]
    x, y = math.prod(shape[1:axis]), math.prod(shape[axis + 1:])
    if seq > length or any(s != u for i, (s, u) in enumerate(zip(shape, ushape)) if i != axis):
        raise node.refuse(f"update {ushape} does not fit the cache {shape} along axis {axis}")
    idx = ctx.cast(ctx.input(node, 2), DType.int64) if node.has_input(2) else \
        ctx.b.const(np.zeros(b, np.int64))
    # source index of each cache position: p - w[b] (mod L when circular); a hit when it lies in [0, S)
    offset = ctx.emit("sub", [ctx.b.const(np.arange(length, dtype=np.int64).reshape(1, length)),
                              ctx.emit("reshape", [idx], shape=[b, 1])])
    if mode == "circular":
        offset = ctx.emit("mod", [offset, ctx.b.const(np.int64(length))])
    hit = ctx.emit("eq", [ctx.emit("reshape", [offset], shape=[b, length, 1]),
                          ctx.b.const(np.arange(seq, dtype=np.int64).reshape(1, 1, seq))])
    dtype = ctx.b.dtype(past)
    if dtype.is_narrow:
        raise node.refuse(f"TensorScatter on {dtype.value}")
    work = DType.float32 if dtype in (DType.float16, DType.bool) else dtype  # one term per output: exact
    onehot = ctx.emit("reshape", [ctx.cast(hit, work)], shape=[b, 1, length, seq])
    picked = ctx.emit("matmul", [onehot, ctx.cast(ctx.emit("reshape", [update], shape=[b, x, seq, y]), work)])
    written = ctx.emit("reshape", [ctx.emit("reduce_max", [ctx.cast(hit, DType.int32)], axes=[2], keepdims=False)],
                       shape=[b, 1, length, 1])
    rows = ctx.emit("reshape", [past], shape=[b, x, length, y])
    out = ctx.emit("where", [ctx.emit("gt", [written, ctx.b.const(np.int32(0))]), ctx.cast(picked, dtype), rows])
    return [ctx.emit("reshape", [out], shape=list(shape))]
