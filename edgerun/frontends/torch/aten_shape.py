"""Handlers for ATen layout ops: views, permutes, slicing, concatenation, splitting, padding, repeat, flip.

All of them become the IR's shape composites, which decompose to raster; torch's view semantics do not
matter here because every value in the IR is a fresh contiguous tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from edgerun.frontends.torch.aten_indexing import index_put_accumulate
from edgerun.frontends.torch.context import ConvertContext, handles
from edgerun.ir.symbolic import Dim, is_symbolic, same_values, sym_max, sym_min, value_range

_INT64_MAX = 2**63 - 1


@handles("aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.lift_fresh_copy.default",
         "aten.contiguous.default", "aten.dropout.default", "aten.alias_copy.default",
         "aten.detach_copy.default")
def _identity(ctx: ConvertContext, node: Any) -> str:
    return ctx.v(node.args[0])


@handles("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.view_copy.default",
         "aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default", "aten.unsqueeze.default",
         "aten.flatten.using_ints", "aten.unflatten.int", "aten.squeeze_copy.dim", "aten.squeeze_copy.dims",
         "aten.unsqueeze_copy.default", "aten._reshape_copy.default")
def _reshape(ctx: ConvertContext, node: Any) -> str:
    # The exported graph knows the result shape; every reshape-like op is that shape with the same elements.
    x = ctx.v(node.args[0])
    shape = ctx.out_shape(node)
    return x if ctx.b.shape(x) == shape else ctx.b.emit("reshape", [x], shape=list(shape))


@handles("aten.permute.default", "aten.permute_copy.default")
def _permute(ctx: ConvertContext, node: Any) -> str:
    x = ctx.v(node.args[0])
    rank = len(ctx.b.shape(x))
    if rank == 0:
        return x
    return ctx.b.emit("transpose", [x], perm=[int(d) % rank for d in node.args[1]])


@handles("aten.transpose.int", "aten.t.default", "aten.transpose_copy.int", "aten.t_copy.default")
def _transpose(ctx: ConvertContext, node: Any) -> str:
    x = ctx.v(node.args[0])
    rank = len(ctx.b.shape(x))
    if rank < 2:
        return x
    d0, d1 = (int(node.args[1]) % rank, int(node.args[2]) % rank) if len(node.args) > 2 else (0, 1)
    perm = list(range(rank))
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ctx.b.emit("transpose", [x], perm=perm)


@handles("aten.expand.default", "aten.expand_copy.default")
def _expand(ctx: ConvertContext, node: Any) -> str:
    x = ctx.v(node.args[0])
    shape = ctx.out_shape(node)
    return x if ctx.b.shape(x) == shape else ctx.b.emit("expand", [x], shape=list(shape))


@handles("aten.cat.default", "aten.concat.default")
def _cat(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    out_shape = ctx.out_shape(node)
    # torch skips legacy empty 1-D inputs of shape (0,) whatever the rank of the others.
    parts = [ctx.operand(t, dtype) for t in a["tensors"]]
    parts = [p for p in parts if ctx.b.shape(p) != (0,) or len(out_shape) == 1]
    if not parts:
        ctx.unsupported("cat of only empty tensors")
    if len(parts) == 1:
        return parts[0]
    return ctx.b.emit("concat", parts, axis=int(a["dim"]) % len(out_shape))


@handles("aten.stack.default")
def _stack(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    out_shape = ctx.out_shape(node)
    axis = int(a["dim"]) % len(out_shape)
    parts = []
    for t in a["tensors"]:
        v = ctx.operand(t, dtype)
        shape = list(ctx.b.shape(v))
        parts.append(ctx.b.emit("reshape", [v], shape=[*shape[:axis], 1, *shape[axis:]]))
    return parts[0] if len(parts) == 1 else ctx.b.emit("concat", parts, axis=axis)


@handles("aten.split_with_sizes.default", "aten.split.Tensor", "aten.split_with_sizes_copy.default",
         "aten.split_copy.Tensor")
def _split(ctx: ConvertContext, node: Any) -> list[str]:
    x = ctx.v(node.args[0])
    shape = ctx.b.shape(x)
    if not shape:
        ctx.unsupported("split of a 0-d tensor")
    axis = int(node.args[2] if len(node.args) > 2 else node.kwargs.get("dim", 0)) % len(shape)
    sizes = [ctx.dims(v.shape)[axis] for v in ctx.fake(node)]
    if len(sizes) == 1:
        return [x]
    return ctx.b.emit_multi("split", [x], axis=axis, sizes=sizes)


@handles("aten.unbind.int", "aten.unbind_copy.int")
def _unbind(ctx: ConvertContext, node: Any) -> list[str]:
    x = ctx.v(node.args[0])
    shape = list(ctx.b.shape(x))
    axis = int(node.args[1] if len(node.args) > 1 else 0) % len(shape)
    parts = [x] if shape[axis] == 1 else ctx.b.emit_multi("split", [x], axis=axis, sizes=[1] * shape[axis])
    return [ctx.b.emit("reshape", [p], shape=shape[:axis] + shape[axis + 1:]) for p in parts]


@handles("aten.slice.Tensor", "aten.slice_copy.Tensor")
def _slice(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    shape = ctx.b.shape(x)
    if not shape:
        ctx.unsupported("slice of a 0-d tensor")
    axis = int(a["dim"]) % len(shape)
    start = 0 if a["start"] is None else ctx.size(a["start"])
    end = _INT64_MAX if a["end"] is None else ctx.size(a["end"])
    step = int(a["step"])
    if step > 0:
        start, end = (_clamp(v, shape[axis], ctx.graph.symbols) for v in (start, end))
    y = ctx.b.emit("slice", [x], starts=[start], ends=[end], axes=[axis], steps=[step])
    want = ctx.out_shape(node)
    if ctx.b.shape(y) != want and not same_values(ctx.b.shape(y), want, ctx.graph.symbols):
        ctx.unsupported("slice bounds this frontend does not resolve like torch")
    return y


def _clamp(bound: Dim, n: Dim, symbols: Mapping[str, tuple[int, int]]) -> Dim:
    """A concrete slice bound clamped into [0, n] as Python does, for a positive step: torch.export writes
    `x[:, 1:]` as slice(x, 1, 1, INT64_MAX) and a TF-style end may be INT32_MAX. On a symbolic axis the
    symbols' bounds decide the clamp where they can; elsewhere it stays a min/max the specialisation evaluates.
    A negative bound counts from the end, which the IR's slice does itself while n + bound >= 0."""
    if is_symbolic(bound):
        return bound
    if not is_symbolic(n):
        return min(bound, n) if bound >= 0 else max(bound, -n)
    if bound >= 0:
        r = value_range(n, symbols)
        if r is not None and bound >= r[1]:
            return n
        return bound if r is not None and bound <= r[0] else sym_min(bound, n)
    r = value_range(n + bound, symbols)
    return bound if r is not None and r[0] >= 0 else sym_max(n + bound, 0)


@handles("aten.narrow.default")
def _narrow(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    rank = len(ctx.b.shape(x))
    axis = int(a["dim"]) % rank
    start = ctx.size(a["start"])
    if not is_symbolic(start) and start < 0:
        start = ctx.b.shape(x)[axis] + start
    return ctx.b.emit("slice", [x], starts=[start], ends=[start + ctx.size(a["length"])], axes=[axis])


@handles("aten.select.int", "aten.select_copy.int")
def _select(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    shape = list(ctx.b.shape(x))
    axis = int(a["dim"]) % len(shape)
    index = ctx.size(a["index"])
    if not is_symbolic(index) and index < 0:  # torch guarantees -n <= index < n
        index = shape[axis] + index
    y = ctx.b.emit("slice", [x], starts=[index], ends=[index + 1], axes=[axis])
    return ctx.b.emit("reshape", [y], shape=shape[:axis] + shape[axis + 1:])


@handles("aten.flip.default")
def _flip(ctx: ConvertContext, node: Any) -> str:
    x = ctx.v(node.args[0])
    shape = ctx.b.shape(x)
    axes = sorted({int(d) % max(len(shape), 1) for d in node.args[1]})
    if not shape or not axes:
        return x
    return ctx.b.emit("slice", [x], starts=[-1] * len(axes), ends=[-_INT64_MAX] * len(axes), axes=axes,
                      steps=[-1] * len(axes))


@handles("aten.roll.default")
def _roll(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    shape = list(ctx.b.shape(x))
    shifts, dims = list(a["shifts"]), list(a["dims"] or [])
    if not dims:
        flat = ctx.b.emit("reshape", [x], shape=[-1])
        rolled = _roll_axis(ctx, flat, int(shifts[0]), 0)
        return ctx.b.emit("reshape", [rolled], shape=shape)
    if len(shifts) != len(dims):
        ctx.unsupported("roll with different numbers of shifts and dims")
    for s, d in zip(shifts, dims):
        x = _roll_axis(ctx, x, int(s), int(d) % len(shape))
    return x


def _roll_axis(ctx: ConvertContext, x: str, shift: int, axis: int) -> str:
    n = ctx.b.shape(x)[axis]
    if n == 0 or shift % n == 0:
        return x
    k = shift % n
    tail = ctx.b.emit("slice", [x], starts=[n - k], ends=[n], axes=[axis])
    head = ctx.b.emit("slice", [x], starts=[0], ends=[n - k], axes=[axis])
    return ctx.b.emit("concat", [tail, head], axis=axis)


@handles("aten.repeat.default")
def _repeat(ctx: ConvertContext, node: Any) -> str:
    x = ctx.v(node.args[0])
    repeats = [int(r) for r in node.args[1]]
    shape = [1] * (len(repeats) - len(ctx.b.shape(x))) + list(ctx.b.shape(x))
    # Interleave a new axis of size r before each axis, broadcast into it, then merge the pairs.
    paired = [d for s in shape for d in (1, s)]
    expanded = [d for r, s in zip(repeats, shape) for d in (r, s)]
    y = ctx.b.emit("reshape", [x], shape=paired)
    y = ctx.b.emit("expand", [y], shape=expanded)
    return ctx.b.emit("reshape", [y], shape=[r * s for r, s in zip(repeats, shape)])


@handles("aten.constant_pad_nd.default")
def _constant_pad(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    pairs = _pad_pairs(ctx, a["pad"], len(ctx.b.shape(x)))
    value = float(a["value"]) if ctx.b.dtype(x).is_float else int(a["value"])
    return ctx.b.emit("pad", [x], pads=pairs, mode="constant", value=value)


def _pad_pairs(ctx: ConvertContext, pad: list[int], rank: int) -> list[list[int]]:
    """torch's flat (last axis first) before/after list as [before, after] per axis."""
    if len(pad) % 2 or len(pad) // 2 > rank:
        ctx.unsupported(f"pad list {list(pad)} does not fit rank {rank}")
    pairs = [[0, 0] for _ in range(rank)]
    for i in range(len(pad) // 2):
        pairs[rank - 1 - i] = [int(pad[2 * i]), int(pad[2 * i + 1])]
    return pairs


@handles("aten.reflection_pad1d.default", "aten.reflection_pad2d.default", "aten.reflection_pad3d.default",
         "aten.replication_pad1d.default", "aten.replication_pad2d.default",
         "aten.replication_pad3d.default")
def _mode_pad(ctx: ConvertContext, node: Any) -> str:
    x = ctx.v(node.args[0])
    pairs = _pad_pairs(ctx, list(node.args[1]), len(ctx.b.shape(x)))
    if any(p < 0 for pair in pairs for p in pair):
        ctx.unsupported("negative reflection/replication padding")
    mode = "reflect" if "reflection" in str(node.target) else "edge"
    return ctx.b.emit("pad", [x], pads=pairs, mode=mode)


@handles("aten.slice_scatter.default", "aten.select_scatter.default")
def _slice_scatter(ctx: ConvertContext, node: Any) -> str:
    """`self` with a slice replaced by `src` (how torch.export writes `buf[a:b] = v`, e.g. a KV-cache row):
    the part before, `src`, and the part after, concatenated."""
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    x, src = ctx.operand(a["self"], dtype), ctx.operand(a["src"], dtype)
    shape = list(ctx.b.shape(x))
    if not shape:
        ctx.unsupported("scatter into a 0-d tensor")
    axis = int(a["dim"]) % len(shape)
    n = shape[axis]
    if "index" in a:  # select_scatter: src lacks the axis
        start = int(a["index"]) % n
        end, step = start + 1, 1
        src = ctx.b.emit("reshape", [src], shape=[*shape[:axis], 1, *shape[axis + 1:]])
    else:
        start = 0 if a["start"] is None else ctx.size(a["start"])
        end = n if a["end"] is None else ctx.size(a["end"])
        # A symbolic bound (a prompt of any length: cache[:seq] = k) is within [0, n] by the export's bounds.
        if not is_symbolic(start):
            start = start % n if start < 0 else min(start, n)
        if not is_symbolic(end):
            end = end % n if end < 0 else min(end, n)
        step = int(a["step"])
    if step != 1:
        ctx.unsupported("slice_scatter with a step other than 1")
    parts = []
    if is_symbolic(start) or start > 0:
        parts.append(ctx.b.emit("slice", [x], starts=[0], ends=[start], axes=[axis]))
    parts.append(src)
    if is_symbolic(end) or end < n:
        parts.append(ctx.b.emit("slice", [x], starts=[end], ends=[n], axes=[axis]))
    return parts[0] if len(parts) == 1 else ctx.b.emit("concat", parts, axis=axis)


@handles("aten.index_copy.default", "aten.index_put.default")
def _write_at_index(ctx: ConvertContext, node: Any) -> str:
    """`buf.index_copy_(dim, pos, rows)` or `buf[pos] = rows` (index_put) with one position known at run
    time (a KV cache's decode step): update_slice, which writes the row in place when `buf` is state."""
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    x = ctx.operand(a["self"], dtype)
    shape = list(ctx.b.shape(x))
    if a.get("accumulate"):
        return index_put_accumulate(ctx, a, x)
    if "indices" in a:  # index_put: one index tensor, after any number of full slices (None)
        indices = list(a["indices"])
        if sum(i is not None for i in indices) != 1 or indices[-1] is None:
            ctx.unsupported("index_put other than one index tensor")
        axis, index_arg, src_arg = len(indices) - 1, indices[-1], a["values"]
    else:
        axis, index_arg, src_arg = int(a["dim"]) % len(shape), a["index"], a["source"]
    index, src = ctx.v(index_arg), ctx.operand(src_arg, dtype)
    if ctx.b.spec(index).numel != 1:
        ctx.unsupported("writing at more than one run-time index (supported: one position)")
    row = [*shape[:axis], 1, *shape[axis + 1:]]
    if list(ctx.b.shape(src)) != row:
        if ctx.b.spec(src).numel != ctx.b.spec(x).numel // max(shape[axis], 1):
            ctx.unsupported(f"the written rows {ctx.b.shape(src)} are not one row {row} of the tensor")
        src = ctx.b.emit("reshape", [src], shape=row)
    return ctx.b.emit("update_slice", [x, src, index], axis=axis)
