"""Layout ONNX ops: each becomes one of our shape composites (one raster) with static attributes.

Shape-like inputs (Reshape's shape, Slice's starts, Pad's pads, ...) must be known at import time.
"""

from __future__ import annotations

import math

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out, onnx_dtype
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.frontends.onnx.symfold import dims_array, interval, is_symbolic
from edgerun.ir.dtypes import DType
from edgerun.ir.ops.raster import strided_copy_regions
from edgerun.ir.symbolic import Dim, SymDim, sym_max, sym_min
from edgerun.ir.tensor_spec import contiguous_strides


def _ints(arr: np.ndarray | None) -> list[Dim]:
    """Sizes, axes or bounds known at import time; symbolic ones (see symfold.py) stay SymDims."""
    return [] if arr is None else [v if isinstance(v, SymDim) else int(v) for v in np.asarray(arr).reshape(-1)]


def _concrete(node: OnnxNode, values: list[Dim], what: str) -> list[int]:
    """Values that must be known exactly at import time (axes, repeat counts): refuse symbolic ones."""
    for v in values:
        if isinstance(v, SymDim):
            raise node.refuse(f"{what} {v} depends on symbolic dimensions {sorted(v.free_symbols)}; pin them "
                              "in input_shapes= (an int instead of (name, min, max))")
    return [int(v) for v in values]


@onnx_op("Constant")
def constant(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    from onnx import numpy_helper
    for key in ("value", "value_float", "value_floats", "value_int", "value_ints"):
        if key in node.attrs:
            v = node.attrs[key]
            if key == "value":
                return [numpy_helper.to_array(v)]
            dtype = np.float32 if "float" in key else np.int64
            return [np.asarray(v, dtype=dtype)]
    for key in ("value_string", "value_strings"):  # a string tensor (strings.py)
        if key in node.attrs:
            from edgerun.frontends.onnx.strings import decoded
            return [np.asarray(decoded(node.attrs[key]), dtype=object)]
    raise node.refuse(f"Constant with attributes {sorted(node.attrs)} (sparse values)")


@onnx_op("Shape")
def shape(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    dims = list(ctx.shape(node.inputs[0]))
    start, end = int(node.attr("start", 0)), node.attr("end")
    return [dims_array(dims[slice(start, None if end is None else int(end))])]


@onnx_op("Size")
def size(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [dims_array(math.prod(ctx.shape(node.inputs[0])))]


@onnx_op("ConstantOfShape")
def constant_of_shape(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    from onnx import numpy_helper
    dims = _ints(ctx.static(node, 0, "shape"))
    value = node.attr("value")
    fill = numpy_helper.to_array(value).reshape(-1)[0] if value is not None else np.float32(0)
    if any(isinstance(d, SymDim) for d in dims):
        # A symbolic shape: the fill value broadcast at run time (one expand of a one-element constant).
        one = ctx.b.const(np.full([1] * len(dims), fill, dtype=np.asarray(fill).dtype))
        return [ctx.emit("expand", [one], shape=dims)]
    return [np.full([int(d) for d in dims], fill, dtype=np.asarray(fill).dtype)]


@onnx_op("Reshape")
def reshape(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    target = _ints(ctx.static(node, 1, "shape"))
    in_shape = ctx.b.shape(x)
    allowzero = bool(node.attr("allowzero", 0))
    if not allowzero:
        target = [in_shape[i] if d == 0 else d for i, d in enumerate(target)]
    target = _infer_minus_one(in_shape, target)
    try:
        return [ctx.emit("reshape", [x], shape=target)]
    except ValueError:
        if not ctx.guarded:
            raise
    # The counts agree only at some sizes (a recognizer's (H + 15) // 48 that must be 1): a guard, checked at
    # each new size (ir/specialize.py), instead of a refusal.
    return [ctx.emit("reshape", [x], shape=target, guard=f"ONNX node {node.name or node.outputs[0]!r} (Reshape)")]


def _infer_minus_one(in_shape: tuple[Dim, ...], target: list[Dim]) -> list[Dim]:
    """A -1 in a Reshape target over symbolic sizes, by cancelling the target's sizes against the input's.

    numel // (product of the others) is exact but stays an undivided expression when the symbols do not cancel
    by themselves ((512*X + 512) // (X + 1)); matching whole dimensions first gives the plain product (512).
    """
    if -1 not in target or not any(isinstance(d, SymDim) for d in (*in_shape, *target)):
        return target
    left = list(in_shape)
    for t in target:
        if t == -1:
            continue
        if t in left:
            left.remove(t)
            continue
        ints = [d for d in left if not isinstance(d, SymDim)]
        whole = math.prod(ints)
        if isinstance(t, SymDim) or t == 0 or whole % t:
            return target  # no exact cancellation: the reshape rule divides
        left = [d for d in left if isinstance(d, SymDim)] + [whole // t]
    return [math.prod(left) if t == -1 else t for t in target]


@onnx_op("Flatten")
def flatten(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    shape_ = ctx.b.shape(x)
    axis = int(node.attr("axis", 1))
    axis = axis + len(shape_) if axis < 0 else axis
    return [ctx.emit("reshape", [x], shape=[math.prod(shape_[:axis]), math.prod(shape_[axis:])])]


@onnx_op("Transpose")
def transpose(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    perm = node.attr("perm")
    rank = len(ctx.b.shape(x))
    return [ctx.emit("transpose", [x], perm=list(perm) if perm is not None else list(range(rank - 1, -1, -1)))]


def _axes_arg(ctx: ImportContext, node: OnnxNode, since: int) -> list[int] | None:
    if node.version >= since:
        arr = ctx.static(node, 1, "axes")
        return None if arr is None else _concrete(node, _ints(arr), "axis")
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


@onnx_op("Squeeze")
def squeeze(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    shp = ctx.b.shape(x)
    axes = _axes_arg(ctx, node, 13)
    named = None if axes is None else {a % len(shp) for a in axes}
    # A symbolic size squeezes only where the symbols' bounds make it 1 for every shape; elsewhere which axes
    # go (or whether the size is 1 at all) would depend on the run-time size.
    ones = {i for i, d in enumerate(shp) if (interval(d, ctx.graph.symbols) == (1, 1) if isinstance(d, SymDim)
                                              else d == 1)}
    unknown = [d for i, d in enumerate(shp) if isinstance(d, SymDim) and i not in ones
               and (named is None or i in named)]
    if unknown and ctx.guarded and named is not None:
        # Squeezing a size that is 1 only at some sizes (a branch taken when a frame count is 1): a guard
        # checked at each new size (ir/specialize.py), the reshape dropping the named axes.
        return [ctx.emit("reshape", [x], shape=[d for i, d in enumerate(shp) if i not in named],
                         guard=f"ONNX node {node.name or node.outputs[0]!r} (Squeeze)")]
    if unknown:
        raise node.refuse_at_bounds(f"Squeeze of symbolic dimension {unknown[0]}, which is 1 only for some shapes: pin it in "
                          "input_shapes= or bound its symbols so that it is always 1")
    drop = ones if named is None else named
    if not drop <= ones:
        raise ValueError(f"Squeeze axes {axes} are not all of size 1 in {shp}")
    always_one = sorted(i for i in drop if isinstance(shp[i], SymDim))
    if always_one:  # a slice of one element gives the size as 1 itself (the bounds guarantee it loses nothing)
        x = ctx.emit("slice", [x], starts=[0] * len(always_one), ends=[1] * len(always_one), axes=always_one)
    return [ctx.emit("reshape", [x], shape=[d for i, d in enumerate(shp) if i not in drop])]


@onnx_op("Unsqueeze")
def unsqueeze(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    shp = list(ctx.b.shape(x))
    axes = _axes_arg(ctx, node, 13) or []
    rank = len(shp) + len(axes)
    norm = sorted({a % rank for a in axes})
    if len(norm) != len(axes):
        raise ValueError(f"Unsqueeze axes {axes} repeat")
    out = []
    it = iter(shp)
    for i in range(rank):
        out.append(1 if i in norm else next(it))
    return [ctx.emit("reshape", [x], shape=out)]


@onnx_op("Concat")
def concat(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    xs = [ctx.input(node, i) for i in range(len(node.inputs)) if node.has_input(i)]
    axis = int(node.attr("axis"))
    try:
        return [ctx.emit("concat", xs, axis=axis)]
    except ValueError:
        if not ctx.guarded:
            raise
    return [ctx.emit("concat", agree_outside(ctx, node, xs, axis), axis=axis)]


def agree_outside(ctx: ImportContext, node: OnnxNode, xs: list[str], axis: int) -> list[str]:
    """`xs` reshaped, under a guard, to agree outside `axis` (where a pooled branch's 1 meets (H + 15) // 48):
    each dimension takes a number where some input has one there, else the first input's size. The guard
    checks at each new size that the sizes agree (ir/specialize.py)."""
    shapes = [ctx.b.shape(x) for x in xs]
    rank = len(shapes[0])
    if any(len(s) != rank for s in shapes):
        raise node.refuse(f"Concat of inputs of ranks {[len(s) for s in shapes]}")
    axis %= rank
    want = [next((s[i] for s in shapes if not isinstance(s[i], SymDim)), shapes[0][i]) for i in range(rank)]
    out = []
    for x, shape in zip(xs, shapes):
        target = [d if i == axis else want[i] for i, d in enumerate(shape)]
        same = all(d == t for d, t in zip(shape, target))
        out.append(x if same else ctx.emit("reshape", [x], shape=target,
                                           guard=f"ONNX node {node.name or node.outputs[0]!r} (Concat)"))
    return out


@onnx_op("Split")
def split(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    axis = int(node.attr("axis", 0))
    n = ctx.b.shape(x)[axis]
    if node.version >= 13:
        sizes = _ints(ctx.static(node, 1, "split")) if node.has_input(1) else []
    else:
        sizes = [int(s) for s in node.attr("split", [])]
    if not sizes:
        parts = int(node.attr("num_outputs", len(node.outputs)))
        chunk = -(-n // parts)
        sizes = [min(chunk, n - i * chunk) for i in range(parts)]
    outs = ctx.b.emit_multi("split", [x], axis=axis, sizes=sizes)
    return list(outs)


@onnx_op("Slice")
def slice_(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    if node.version < 10:
        starts, ends = node.attr("starts"), node.attr("ends")
        axes, steps = node.attr("axes"), None
    else:
        starts, ends = _ints(ctx.static(node, 1, "starts")), _ints(ctx.static(node, 2, "ends"))
        axes = _ints(ctx.static(node, 3, "axes")) if node.has_input(3) else None
        steps = _ints(ctx.static(node, 4, "steps")) if node.has_input(4) else None
    shape = ctx.b.shape(x)
    rank = len(shape)
    axes = [a % rank for a in _concrete(node, list(axes if axes is not None else range(len(starts))), "Slice axis")]
    # ONNX clamps INT64 sentinels; Python's slice.indices in our rule does the same clamping. A symbolic axis
    # cannot be clamped by the rule, so bounds past its largest size are clamped here (symbols' bounds).
    step_list = _concrete(node, list(steps), "Slice step") if steps is not None else [1] * len(axes)
    starts_, ends_ = _ints(np.asarray(starts, object)), _ints(np.asarray(ends, object))
    attrs: dict[str, object] = {
        "starts": [_clamp(v, shape[a], ctx.graph.symbols) if st > 0 else v for v, a, st in zip(starts_, axes, step_list)],
        "ends": [_clamp(v, shape[a], ctx.graph.symbols) if st > 0 else v for v, a, st in zip(ends_, axes, step_list)],
        "axes": axes}
    if steps is not None:
        attrs["steps"] = step_list
    return [ctx.emit("slice", [x], **attrs)]


def _clamp(bound: Dim, size: Dim, symbols: dict[str, tuple[int, int]]) -> Dim:
    """A concrete slice bound on a symbolic axis, clamped into [0, size] as ONNX clamps it, for every size.

    The shape rule cannot clamp against a symbolic size, so the clamp is written into the bound: `size` when
    the bound is past the axis's largest size (INT32_MAX / INT64_MAX sentinels: no axis reaches 2^31 - 1),
    `min(bound, size)` when only some sizes are shorter; a negative bound counts from the end and stops at 0.
    """
    if not isinstance(size, SymDim) or isinstance(bound, SymDim):
        return bound
    bounds = interval(size, symbols)
    lo, hi = bounds if bounds is not None else (None, None)
    if bound >= 0:
        if bound >= (1 << 31) - 1 or (hi is not None and bound >= hi):
            return size
        return bound if lo is not None and bound <= lo else sym_min(bound, size)
    if bound <= -((1 << 31) - 1) or (hi is not None and -bound >= hi):
        return 0
    return size + bound if lo is not None and -bound <= lo else sym_max(size + bound, 0)


@onnx_op("Pad")
def pad(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    rank = len(ctx.b.shape(x))
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise node.refuse(f"pad mode {mode!r}")
    if node.version < 11:
        pads, value = [int(p) for p in node.attr("pads")], float(node.attr("value", 0.0))
        axes = list(range(rank))
    else:
        pads = _ints(ctx.static(node, 1, "pads"))
        cv = ctx.static(node, 2, "constant_value")
        value = cv.reshape(-1)[0].item() if cv is not None and cv.size else 0
        axes = ([a % rank for a in _concrete(node, _ints(ctx.static(node, 3, "axes")), "Pad axis")]
                if node.has_input(3) else list(range(rank)))
    pairs = [[0, 0] for _ in range(rank)]
    k = len(axes)
    for i, a in enumerate(axes):
        pairs[a] = [pads[i], pads[i + k]]
    if mode == "wrap":
        return [_wrap_pad(ctx, node, x, pairs)]
    attrs: dict[str, object] = {"pads": pairs, "mode": mode}
    if mode == "constant":
        attrs["value"] = value
    return [ctx.emit("pad", [x], **attrs)]


def _wrap_pad(ctx: ImportContext, node: OnnxNode, x: str, pairs: list[list[int]]) -> str:
    """Circular padding: the tail of each axis before it and its head after it (a slice and a concat)."""
    for axis, (before, after) in enumerate(pairs):
        n = ctx.b.shape(x)[axis]
        if before < 0 or after < 0 or max(before, after) > n:
            raise node.refuse(f"wrap padding {before},{after} on an axis of {n}")
        parts = []
        if before:
            parts.append(ctx.emit("slice", [x], starts=[n - before], ends=[n], axes=[axis]))
        parts.append(x)
        if after:
            parts.append(ctx.emit("slice", [x], starts=[0], ends=[after], axes=[axis]))
        if len(parts) > 1:
            x = ctx.emit("concat", parts, axis=axis)
    return x


@onnx_op("Expand")
def expand(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    return [ctx.emit("expand", [x], shape=_ints(ctx.static(node, 1, "shape")))]


@onnx_op("Tile")
def tile(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    reps = _concrete(node, _ints(ctx.static(node, 1, "repeats")), "Tile repeat count")
    shp = ctx.b.shape(x)
    # Tile = broadcast to [r0, d0, r1, d1, ...] then merge each pair: one expand and one reshape.
    inter = [v for r, d in zip(reps, shp) for v in (1, d)]
    target = [v for r, d in zip(reps, shp) for v in (r, d)]
    y = ctx.emit("expand", [ctx.emit("reshape", [x], shape=inter)], shape=target)
    return [ctx.emit("reshape", [y], shape=[r * d for r, d in zip(reps, shp)])]


@onnx_op("DepthToSpace", "SpaceToDepth")
def depth_space(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    n, c, h, w = ctx.b.shape(x)
    bs = int(node.attr("blocksize"))
    if node.op_type == "SpaceToDepth":
        y = ctx.emit("reshape", [x], shape=[n, c, h // bs, bs, w // bs, bs])
        crd = node.attr("mode", "DCR") == "CRD"
        y = ctx.emit("transpose", [y], perm=[0, 1, 3, 5, 2, 4] if crd else [0, 3, 5, 1, 2, 4])
        return [ctx.emit("reshape", [y], shape=[n, c * bs * bs, h // bs, w // bs])]
    if node.attr("mode", "DCR") == "DCR":
        y = ctx.emit("reshape", [x], shape=[n, bs, bs, c // (bs * bs), h, w])
        y = ctx.emit("transpose", [y], perm=[0, 3, 4, 1, 5, 2])
    else:
        y = ctx.emit("reshape", [x], shape=[n, c // (bs * bs), bs, bs, h, w])
        y = ctx.emit("transpose", [y], perm=[0, 1, 4, 2, 5, 3])
    return [ctx.emit("reshape", [y], shape=[n, c // (bs * bs), h * bs, w * bs])]


@onnx_op("EyeLike")
def eye_like(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    shp = ctx.shape(node.inputs[0])
    dtype = onnx_dtype(int(node.attr("dtype")), "EyeLike dtype").np if "dtype" in node.attrs \
        else ctx.dtype(node.inputs[0]).np
    return [np.eye(shp[0], shp[1], k=int(node.attr("k", 0)), dtype=dtype)]


@onnx_op("Range")
def range_(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    if node.inputs[1] in ctx.float_sizes:
        return [_range_to_float_size(ctx, node)]
    start, limit, delta = (ctx.static(node, i, name) for i, name in enumerate(("start", "limit", "delta")))
    assert start is not None and limit is not None and delta is not None
    if any(is_symbolic(v) for v in (start, limit, delta)):
        return [_symbolic_range(ctx, node, start, limit, delta)]
    return [np.arange(start.item(), limit.item(), delta.item()).astype(start.dtype)]


def _range_to_float_size(ctx: ImportContext, node: OnnxNode) -> str:
    """Range up to a size cast to float (a detector's anchor grid: arange(float(w))): with a start and step
    that are whole numbers, the same values as the integer range, cast; so its length stays symbolic."""
    start, delta = ctx.const(node.inputs[0]), ctx.const(node.inputs[2])
    if start is None or delta is None or start.size != 1 or delta.size != 1 or \
            not float(start.item()).is_integer() or not float(delta.item()).is_integer():
        raise node.refuse("Range up to a size cast to float needs a constant whole-number start and step; pin "
                          "the dimensions in input_shapes=")
    whole = _symbolic_range(ctx, node, np.asarray(int(start.item()), np.int64),
                            ctx.float_sizes[node.inputs[1]], np.asarray(int(delta.item()), np.int64))
    return ctx.cast(whole, DType.of(start))


def _symbolic_range(ctx: ImportContext, node: OnnxNode, start: np.ndarray, limit: np.ndarray,
                    delta: np.ndarray) -> str:
    """Range up to a symbolic limit: the values up to the limit's bound, as a constant, cut to the length.

    Exact for every size in the bounds; only the limit may be symbolic (a symbolic start or step would make
    the values themselves depend on the call).
    """
    if is_symbolic(start) or is_symbolic(delta):
        raise node.refuse("Range with a symbolic start or delta: its values depend on the run-time size; pin the "
                          "dimensions in input_shapes=")
    end = limit.reshape(-1)[0]
    step = delta.item()
    bounds = interval(end, ctx.graph.symbols)
    if bounds is None or start.dtype.kind not in "iu" or step == 0:
        raise node.refuse(f"Range up to symbolic {end}: needs integer values and bounds on its symbols")
    widest = bounds[1] if step > 0 else bounds[0]
    values = np.arange(start.item(), widest, step).astype(start.dtype)
    count = (end - int(start.item()) + step - 1) // step if step > 0 else (int(start.item()) - end - step - 1) // -step
    count_bounds = interval(count, ctx.graph.symbols)
    length = count if count_bounds is not None and count_bounds[0] >= 0 else sym_max(count, 0)
    return ctx.emit("slice", [ctx.b.const(values)], starts=[0], ends=[length], axes=[0])


def reverse_axis(ctx: ImportContext, x: str, axis: int) -> str:
    """x flipped along axis: one raster with a negative source stride."""
    shp = ctx.b.shape(x)
    strides = contiguous_strides(shp)
    src = [(-s if i == axis else s) for i, s in enumerate(strides)]
    regions = strided_copy_regions(0, (shp[axis] - 1) * strides[axis], src, 0, strides, shp)
    return ctx.emit("raster", [x], regions=regions, shape=list(shp), fill=None)
