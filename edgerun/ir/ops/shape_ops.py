"""Composite layout ops, each a decomposition into one raster (or none, when it is the identity)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from edgerun.ir.builder import Builder
from edgerun.ir.ops._rules import broadcast_shapes, norm_axis, same_dtype
from edgerun.ir.ops.raster import strided_copy_regions
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.symbolic import SymbolicShapeError, as_dim, exact_quotient, is_symbolic
from edgerun.ir.tensor_spec import TensorSpec, contiguous_strides

Attrs = dict[str, Any]


def _copy_view(b: Builder, x: str, offset: int, strides: Sequence[int], shape: Sequence[int]) -> str:
    """One raster that materialises a strided view of `x` as a contiguous tensor of `shape`."""
    regions = strided_copy_regions(0, offset, strides, 0, contiguous_strides(tuple(shape)), shape)
    return b.emit("raster", [x], regions=regions, shape=list(shape), fill=None)


def _composite(name: str, rule: Any, decompose: Any, lo: int, hi: int | None, doc: str) -> None:
    register(OpDef(name, OpKind.COMPOSITE, rule, lo, hi, decompose=decompose, doc=doc))


# ---- transpose ---------------------------------------------------------------------------------------

def _perm(attrs: Attrs, rank: int) -> list[int]:
    perm = [norm_axis(int(p), rank) for p in attrs.get("perm", range(rank - 1, -1, -1))]
    if sorted(perm) != list(range(rank)):
        raise ValueError(f"transpose perm {attrs.get('perm')} is not a permutation of {rank} axes")
    return perm


def _transpose_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    return [TensorSpec(tuple(x.shape[p] for p in _perm(attrs, x.rank)), x.dtype)]


def _transpose(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    shape = b.shape(ins[0])
    perm = _perm(attrs, len(shape))
    if perm == sorted(perm):
        return [ins[0]]
    strides = contiguous_strides(shape)
    return [_copy_view(b, ins[0], 0, [strides[p] for p in perm], [shape[p] for p in perm])]


_composite("transpose", _transpose_rule, _transpose, 1, 1, "permute axes (attr perm; default reverses)")

# ---- reshape / flatten -------------------------------------------------------------------------------


def resolve_shape(numel: int, shape: Sequence[int]) -> tuple[int, ...]:
    """Resolve one -1 in a target shape; ValueError when the element counts differ.

    Symbolic sizes work when the counts agree by their forms (batch*seq*32 into [batch, seq, 4, 8]); a -1
    beside symbolic sizes needs the division to be exact on the forms.
    """
    shape = [as_dim(d) for d in shape]
    static = [d for d in shape if not is_symbolic(d)]
    if static.count(-1) > 1 or any(d < -1 for d in static):
        raise ValueError(f"reshape target {shape} may hold at most one -1 and no other negative")
    if -1 in static:
        known = math.prod(d for d in shape if is_symbolic(d) or d != -1)
        quotient = exact_quotient(numel, known) if is_symbolic(numel) or is_symbolic(known) else None
        if quotient is not None:
            shape[static_index(shape, -1)] = quotient
        else:
            if known == 0 or numel % known:
                raise ValueError(f"cannot reshape {numel} elements into {shape}")
            shape[static_index(shape, -1)] = numel // known
    if math.prod(shape) != numel:
        raise ValueError(f"cannot reshape {numel} elements into {shape}")
    return tuple(shape)


def static_index(shape: Sequence[int], value: int) -> int:
    """Index of the first int dimension equal to value (symbolic dimensions never equal an int)."""
    return next(i for i, d in enumerate(shape) if not is_symbolic(d) and d == value)


def _reshape_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    try:
        return [TensorSpec(resolve_shape(ins[0].numel, attrs["shape"]), ins[0].dtype)]
    except ValueError:
        # A guarded reshape (attr guard: where it came from) holds over symbolic sizes only where the element
        # counts agree, which the import could not prove for every size: specialisation checks it per size
        # (ir/specialize.py: check_guards). Once the sizes are numbers the counts must agree as always.
        target = tuple(as_dim(d) for d in attrs["shape"])
        if not attrs.get("guard") or -1 in target or not (is_symbolic(ins[0].numel)
                                                          or any(is_symbolic(d) for d in target)):
            raise
        return [TensorSpec(target, ins[0].dtype)]


def _reshape(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    shape = resolve_shape(b.spec(ins[0]).numel, attrs["shape"])
    if shape == b.shape(ins[0]):
        return [ins[0]]
    return [_copy_view(b, ins[0], 0, contiguous_strides(shape), shape)]


_composite("reshape", _reshape_rule, _reshape, 1, 1, "same elements, new shape (attr shape; one -1 allowed; attr "
           "guard, naming its origin, when the counts agree only at some symbolic sizes: checked per size)")


def _flat_shape(shape: tuple[int, ...], attrs: Attrs) -> tuple[int, ...]:
    rank = max(len(shape), 1)
    start = norm_axis(int(attrs.get("start", 1)), rank)
    end = norm_axis(int(attrs.get("end", -1)), rank)
    if end < start:
        raise ValueError(f"flatten end {end} is before start {start}")
    return (*shape[:start], math.prod(shape[start:end + 1]), *shape[end + 1:])


def _flatten_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    return [TensorSpec(_flat_shape(ins[0].shape, attrs), ins[0].dtype)]


def _flatten(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    return [b.emit("reshape", ins, shape=list(_flat_shape(b.shape(ins[0]), attrs)))]


_composite("flatten", _flatten_rule, _flatten, 1, 1, "merge axes start..end (attrs start=1, end=-1)")

# ---- slice -------------------------------------------------------------------------------------------


def slice_ranges(shape: tuple[int, ...], attrs: Attrs) -> list[tuple[int, int, int]]:
    """(start, step, length) per axis after Python/ONNX clamping of starts, ends and steps."""
    rank = len(shape)
    starts, ends = list(attrs["starts"]), list(attrs["ends"])
    axes = [norm_axis(int(a), rank) for a in attrs.get("axes", range(len(starts)))]
    steps = list(attrs.get("steps") or [1] * len(starts))
    if not len(starts) == len(ends) == len(axes) == len(steps) or len(set(axes)) != len(axes):
        raise ValueError("slice starts, ends, axes and steps must have one entry per distinct axis")
    ranges = [(0, 1, n) for n in shape]
    for start, end, axis, step in zip(starts, ends, axes, steps):
        if int(step) == 0:
            raise ValueError("slice step must not be 0")
        if any(is_symbolic(v) for v in (start, end, shape[axis])):
            ranges[axis] = _symbolic_slice(as_dim(start), as_dim(end), int(step), shape[axis])
            continue
        s, e, st = slice(int(start), int(end), int(step)).indices(shape[axis])
        ranges[axis] = (s, st, len(range(s, e, st)))
    return ranges


_OPEN_END = 1 << 62  # an end at least this large means "to the end of the axis" (torch's INT64_MAX)


def _symbolic_slice(start: int, end: int, step: int, n: int) -> tuple[int, int, int]:
    """(start, step, length) when the axis or a bound is symbolic: Python's rules without the clamping.

    Clamping needs the value of the axis, so bounds are taken as given (negative ones count from the end);
    a bound outside the axis at some shape fails the concrete check when the program is specialised.
    """
    if step < 0:
        if start == -1 and not is_symbolic(end) and end <= -_OPEN_END:
            return (n - 1, step, n)  # a whole reversed axis (flip)
        raise SymbolicShapeError(f"a negative-step slice of symbolic axis {str(n)!r} needs a concrete size")
    if not is_symbolic(start) and start < 0:
        start = n + start
    if not is_symbolic(end):
        end = n if end >= _OPEN_END else n + end if end < 0 else end
    length = (end - start + step - 1) // step
    return (start, step, length)


def _slice_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    return [TensorSpec(tuple(n for _, _, n in slice_ranges(ins[0].shape, attrs)), ins[0].dtype)]


def _slice(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    shape = b.shape(ins[0])
    ranges = slice_ranges(shape, attrs)
    if all(s == 0 and st == 1 and n == d for (s, st, n), d in zip(ranges, shape)):
        return [ins[0]]
    strides = contiguous_strides(shape)
    offset = sum(s * stride for (s, _, _), stride in zip(ranges, strides))
    return [_copy_view(b, ins[0], offset, [st * stride for (_, st, _), stride in zip(ranges, strides)],
                       [n for _, _, n in ranges])]


_composite("slice", _slice_rule, _slice, 1, 1,
           "strided sub-tensor (attrs starts, ends, axes, steps; Python clamping, negative steps allowed)")

# ---- concat / split ----------------------------------------------------------------------------------


def _concat_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    dtype = same_dtype(ins, "concat")
    rank = ins[0].rank
    axis = norm_axis(int(attrs.get("axis", 0)), rank)
    for s in ins:
        if s.rank != rank or any(a != c for i, (a, c) in enumerate(zip(s.shape, ins[0].shape)) if i != axis):
            raise ValueError(f"concat inputs differ outside axis {axis}: {[str(x) for x in ins]}")
    shape = list(ins[0].shape)
    shape[axis] = sum(s.shape[axis] for s in ins)
    return [TensorSpec(tuple(shape), dtype)]


def _concat(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    out_shape = _concat_rule([b.spec(i) for i in ins], attrs)[0].shape
    axis = norm_axis(int(attrs.get("axis", 0)), len(out_shape))
    dst_strides = contiguous_strides(out_shape)
    regions: list[list[int]] = []
    sources: list[str] = []
    offset = 0
    for x in ins:
        shape = b.shape(x)
        if shape[axis]:
            regions += strided_copy_regions(len(sources), 0, contiguous_strides(shape),
                                            offset * dst_strides[axis], dst_strides, shape)
            sources.append(x)
        offset += shape[axis]
    if not sources:  # every input empty: a zero-size output still needs a producer
        sources = ins[:1]
    return [b.emit("raster", sources, regions=regions, shape=list(out_shape), fill=None)]


_composite("concat", _concat_rule, _concat, 1, None, "join along attr axis")


def _split_sizes(spec: TensorSpec, attrs: Attrs) -> tuple[int, list[int]]:
    axis = norm_axis(int(attrs.get("axis", 0)), spec.rank)
    sizes = [as_dim(s) for s in attrs["sizes"]]
    if any(not is_symbolic(s) and s < 0 for s in sizes) or sum(sizes) != spec.shape[axis]:
        raise ValueError(f"split sizes {sizes} do not add up to {spec.shape[axis]} on axis {axis}")
    return axis, sizes


def _split_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    axis, sizes = _split_sizes(ins[0], attrs)
    shape = list(ins[0].shape)
    return [TensorSpec(tuple([*shape[:axis], n, *shape[axis + 1:]]), ins[0].dtype) for n in sizes]


def _split(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    axis, sizes = _split_sizes(b.spec(ins[0]), attrs)
    outs, start = [], 0
    for n in sizes:
        outs.append(b.emit("slice", ins, starts=[start], ends=[start + n], axes=[axis]))
        start += n
    return outs


_composite("split", _split_rule, _split, 1, 1, "cut along attr axis into attr sizes (one output each)")

# ---- pad ---------------------------------------------------------------------------------------------


def _pad_pairs(spec: TensorSpec, attrs: Attrs) -> list[tuple[int, int]]:
    pads = [(int(a), int(c)) for a, c in attrs["pads"]]
    if len(pads) != spec.rank:
        raise ValueError(f"pad needs [before, after] for each of {spec.rank} axes, got {attrs['pads']}")
    for (a, c), n in zip(pads, spec.shape):
        if not is_symbolic(n) and n + a + c < 0:
            raise ValueError(f"pad {a},{c} crops more than the axis of {n}")
    mode = attrs.get("mode", "constant")
    if mode not in ("constant", "reflect", "edge"):
        raise ValueError(f"pad mode must be constant, reflect or edge, got {mode!r}")
    if mode != "constant":
        for (a, c), n in zip(pads, spec.shape):
            if (a or c) and not is_symbolic(n) and (n == 0 or (mode == "reflect" and max(a, c) >= n)):
                raise ValueError(f"{mode} pad of {a},{c} needs a larger axis than {n}")
    return pads


def _pad_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    pads = _pad_pairs(ins[0], attrs)
    return [TensorSpec(tuple(n + a + c for n, (a, c) in zip(ins[0].shape, pads)), ins[0].dtype)]


def _pad(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    spec = b.spec(ins[0])
    pads = _pad_pairs(spec, attrs)
    mode = attrs.get("mode", "constant")
    if all(a == 0 and c == 0 for a, c in pads):
        return [ins[0]]
    if mode == "constant":
        out_shape = tuple(n + a + c for n, (a, c) in zip(spec.shape, pads))
        src_strides, dst_strides = contiguous_strides(spec.shape), contiguous_strides(out_shape)
        # Negative pads crop: start later in the source, and copy less.
        src_off = sum(max(0, -a) * s for (a, _), s in zip(pads, src_strides))
        dst_off = sum(max(0, a) * s for (a, _), s in zip(pads, dst_strides))
        sizes = [n + min(0, a) + min(0, c) for n, (a, c) in zip(spec.shape, pads)]
        regions = strided_copy_regions(0, src_off, src_strides, dst_off, dst_strides, sizes)
        fill = attrs.get("value", 0)
        return [b.emit("raster", ins, regions=regions, shape=list(out_shape), fill=fill)]
    # reflect / edge: pad one axis at a time, in three strided regions: the rows before the source
    # (reflect reads them backwards from row `a`, edge repeats row 0 with stride 0), the source, the rows after.
    x = ins[0]
    for axis, (a, c) in enumerate(pads):
        if not (a or c):
            continue
        shape = b.shape(x)
        n = shape[axis]
        padded = [*shape[:axis], n + a + c, *shape[axis + 1:]]
        src_strides, dst_strides = contiguous_strides(shape), contiguous_strides(tuple(padded))
        reflect = mode == "reflect"
        # (first output row, rows, first source row, source row step); negative pads crop the middle piece.
        pieces = [(0, a, a if reflect else 0, -1 if reflect else 0),
                  (max(0, a), n + min(0, a) + min(0, c), max(0, -a), 1),
                  (a + n, c, n - 2 if reflect else n - 1, -1 if reflect else 0)]
        regions = []
        for first, rows, src_row, step in pieces:
            if rows <= 0:
                continue
            sizes = [*shape[:axis], rows, *shape[axis + 1:]]
            strides = [s * step if i == axis else s for i, s in enumerate(src_strides)]
            regions += strided_copy_regions(0, src_row * src_strides[axis], strides,
                                            first * dst_strides[axis], dst_strides, sizes)
        x = b.emit("raster", [x], regions=regions, shape=padded, fill=None)
    return [x]


_composite("pad", _pad_rule, _pad, 1, 1,
           "pad or crop (attr pads: [before, after] per axis; mode constant with value, reflect, or edge)")

# ---- expand ------------------------------------------------------------------------------------------


def _expand_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    target = tuple(as_dim(d) for d in attrs["shape"])
    shape = broadcast_shapes(ins[0].shape, target)
    return [TensorSpec(shape, ins[0].dtype)]


def _expand(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    in_shape = b.shape(ins[0])
    out_shape = _expand_rule([b.spec(ins[0])], attrs)[0].shape
    if out_shape == in_shape:
        return [ins[0]]
    lead = len(out_shape) - len(in_shape)
    in_strides = contiguous_strides(in_shape)
    strides = [0] * lead + [0 if n == 1 else s for n, s in zip(in_shape, in_strides)]
    return [_copy_view(b, ins[0], 0, strides, out_shape)]


_composite("expand", _expand_rule, _expand, 1, 1, "broadcast to attr shape (numpy rules)")
