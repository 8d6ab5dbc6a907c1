"""Raster as ONNX: the layout ops it stands for (Transpose, Slice, Pad, Reshape, Concat, Expand, a row
Gather), read back from the regions (edgerun.ir.region.Region); a Gather only where nothing else expresses it.

A region is a strided 3-D view of a flat source written into a strided 3-D view of the flat output. Three
readings, tried in turn (the second and third live in onnx_raster_gathers.py):

1. **Boxes.** Each region's destination is a box of the output (lo, size per output axis), its dimensions
   split over the output axes they span. Its source is a Reshape of the flat source into nested blocks, a
   stepped Slice (negative strides: a reversing Slice; zero strides: Expand) and a Transpose. Boxes that tile
   the output are assembled by guillotine cuts: along some axis the regions fall into disjoint groups (boxes
   whose intervals overlap share a group), each assembled recursively, then one Concat (slabs padded with
   the fill across the other axes where a region leaves a band unwritten). A run of single rows read from
   one source at evenly spaced offsets, or of the three pieces a reflect or edge pad decomposes into (rows
   read backwards or repeated, the source, rows after), is one view of the rows it reads, then a Pad
   (reflect/edge), a stepped Slice, or a Gather with a per-row index (a few int64, not one per element).
   Whatever the boxes leave uncovered is the fill: one constant Pad. That covers transpose, reshape,
   slice with steps, flip, broadcast, concat, split, pad (constant, reflect, edge) and channel shuffles.
   The output's axes are first split wherever a region's destination stride falls inside one, so a channel
   shuffle (one region over [C/g, g, HW]) is one box of [C/g, g, HW]: Reshape -> Transpose -> Reshape, and
   interleaved slabs (a shuffle fused with its concat) are a Concat of boxes in that finer view.
2. **Rows**, when every region copies whole rows (a chain of shuffles merged into one raster): row views,
   a Concat and one Gather with a per-row index.
3. **A computed gather** for the rest, its index computed from a few integers per region.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise

import numpy as np

from edgerun.backends.onnxruntime.onnx_ops import OnnxBuilder
from edgerun.backends.onnxruntime.onnx_raster_gathers import emit_computed_gather, emit_row_gather
from edgerun.backends.onnxruntime.onnx_views import INT64_MIN, strided_view, view_fits
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Node
from edgerun.ir.region import Region, regions_of

# A region dimension this short whose source view does not nest is unrolled into one region per index.
UNROLL_LIMIT = 8
# A run of rows whose indices fall into more arithmetic runs than this is a Gather with a per-row index.
MAX_SLICE_RUNS = 3
# A single-region raster is checked element by element against a plain slice up to this many elements.
PLAIN_SLICE_CHECK_LIMIT = 1 << 21
# ONNX Runtime's Pad kernel has no float16 constant path on every version; such pads take the gather.
PAD_DTYPES = frozenset({DType.float32, DType.int32, DType.int64, DType.int8, DType.uint8, DType.bool})


def emit_raster(b: OnnxBuilder, node: Node) -> None:
    out = node.outputs[0]
    shape = list(b.graph.specs[out].shape)
    regions = [r for r in regions_of(node.attrs) if r.numel]
    fill = node.attrs.get("fill")
    if len(regions) == 1 and _emit_plain_slice(b, node, regions[0], shape):
        return
    if regions and (fill is None or b.graph.specs[out].dtype in PAD_DTYPES):
        mark = (len(b.nodes), len(b.initializers))
        value = _assemble_output(b, node, regions, shape, fill)
        if value is not None:
            b.node("Reshape", [value, b.ints(shape)], [out])
            return
        del b.nodes[mark[0]:], b.initializers[mark[1]:]  # a reading that did not fit leaves nothing behind
    if regions and emit_row_gather(b, node, regions, fill):
        return
    emit_computed_gather(b, node, regions, fill)


def _emit_plain_slice(b: OnnxBuilder, node: Node, region: Region, shape: list[int]) -> bool:
    """A raster whose one region copies a box of its source, in the source's own shape, onto the whole output
    (a split's part, a crop) as one Slice of that source along the axes it cuts.

    Why not the box reading: that works on the region's merged axes, which change with the sizes. The same
    split at one row (a decode step) merges the unit axis and reads as a flat slice of a [-1] view, at 128
    rows as a 3-D one; read here, both are `Slice(x, [start], [end], axes=[1])`, so the two lengths' ONNX
    graphs match node for node and one session serves both (onnx_shape_variants.py)."""
    src_shape = list(b.graph.specs[node.inputs[region.src]].shape)
    numel = math.prod(shape)
    if (len(src_shape) != len(shape) or region.numel != numel or numel > PLAIN_SLICE_CHECK_LIMIT
            or not 0 <= region.src_offset < math.prod(src_shape)):
        return False
    starts = [int(i) for i in np.unravel_index(region.src_offset, src_shape)]
    axes = [a for a, (n, m) in enumerate(zip(shape, src_shape)) if n != m]
    if not axes or any(s + n > m for s, n, m in zip(starts, shape, src_shape)):
        return False
    # The region must be exactly that slice: compare its (destination, source) pairs with the slice's.
    dst, src = region.index_grids()
    order = np.argsort(dst, kind="stable")
    if not np.array_equal(dst[order], np.arange(numel)):
        return False
    index = np.indices(shape, dtype=np.int64).reshape(len(shape), -1)
    expected = region.src_offset + np.asarray(_strides(src_shape), np.int64) @ index
    if not np.array_equal(src[order], expected):
        return False
    b.node("Slice", [node.inputs[region.src], b.ints([starts[a] for a in axes], "starts"),
                     b.ints([starts[a] + shape[a] for a in axes], "ends"), b.ints(axes, "axes")], [node.outputs[0]])
    return True


# ---- 1. boxes -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Box:
    """Where a region writes (lo, size per output axis) and what it reads: source, offset, and per output
    axis it moves along, (axis, count, source stride)."""

    src: int
    offset: int
    lo: tuple[int, ...]
    size: tuple[int, ...]  # the extent written along each axis (with steps: (count - 1) * step + 1)
    dims: tuple[tuple[int, int, int], ...]
    steps: tuple[int, ...] = ()  # per axis, where the box writes every step-th element (fill between)

    def hi(self, axis: int) -> int:
        return self.lo[axis] + self.size[axis]


def _strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[k + 1:]) for k in range(len(shape))]


def _box_of(region: Region, shape: Sequence[int], dilate: bool = False) -> _Box | None:
    """The box `region` writes in the row-major output of `shape`, or None when it is not a box. With
    `dilate` (a raster with a fill), a dimension may write every m-th element of one axis (ConvTranspose's
    zero insertion)."""
    doff = region.dst_offset
    strides = _strides(shape)
    if not 0 <= doff < math.prod(shape):
        return None
    lo = [doff // st % n for st, n in zip(strides, shape)]
    size = [1] * len(shape)
    steps = [1] * len(shape)
    dims: list[tuple[int, int, int]] = []
    moving = zip(region.size, region.src_strides, region.dst_strides)
    for n, s, d in sorted(((n, s, d) for n, s, d in moving if n != 1), key=lambda t: -t[2]):
        axes = [k for k in range(len(shape)) if strides[k] == d and shape[k] > 1]
        if not axes and dilate:
            stepped = [k for k in range(len(shape)) if shape[k] > 1 and d > 0 and d % strides[k] == 0
                       and lo[k] + (n - 1) * (d // strides[k]) < shape[k] and size[k] == 1]
            if stepped:
                k = stepped[0]
                steps[k] = d // strides[k]
                size[k] = (n - 1) * steps[k] + 1
                dims.append((k, n, s))
                continue
        if not axes:
            return None
        k = axes[0]
        while n > 1:  # a dimension may span several output axes (merged when the box is full inside)
            while k >= 0 and shape[k] == 1:
                k -= 1
            if k < 0 or size[k] != 1:
                return None
            if n <= shape[k] - lo[k]:
                size[k] = n
                dims.append((k, n, s))
                break
            if lo[k] or n % shape[k]:
                return None
            size[k] = shape[k]
            dims.append((k, shape[k], s))
            s, n, k = s * shape[k], n // shape[k], k - 1
    return _Box(region.src, region.src_offset, tuple(lo), tuple(size), tuple(sorted(dims)),
                tuple(steps) if dilate else ())


def _refined(shape: list[int], regions: list[Region]) -> list[int]:
    """The output's shape with axes split wherever a region's destination stride falls inside one: a region
    writing [n, 2] blocks of an axis of 4 sees it as [2, 2]. Row-major, so the same memory either way."""
    shape = list(shape)
    for r in regions:
        for n, d in zip(r.size, r.dst_strides):
            if n == 1 or d <= 0:
                continue
            strides = _strides(shape)
            for k in range(len(shape)):
                outer = strides[k] * shape[k]
                if strides[k] < d < outer and d % strides[k] == 0 and shape[k] % (d // strides[k]) == 0:
                    m = d // strides[k]
                    shape[k:k + 1] = [shape[k] // m, m]
                    break
    return shape


def _boxes(regions: list[Region], shape: Sequence[int], dilate: bool) -> list[_Box] | None:
    out = []
    for r in regions:
        box = _box_of(r, shape, dilate)
        if box is None:
            return None
        out.append(box)
    return out


def _unrolled(b: OnnxBuilder, node: Node, regions: list[Region]) -> list[Region]:
    """Regions whose source view does not nest, split along a short dimension (a few slices beat a gather)."""
    out = []
    for r in regions:
        dims = [(n, s) for n, s in zip(r.size, r.src_strides) if n != 1]
        name = node.inputs[r.src]
        if view_fits(b.graph.specs[name].numel, r.src_offset, dims):
            out.append(r)
            continue
        k = min((k for k in range(3) if 1 < r.size[k] <= UNROLL_LIMIT), key=lambda k: r.size[k], default=None)
        if k is None:
            out.append(r)
            continue
        for i in range(r.size[k]):
            out.append(replace(r, src_offset=r.src_offset + i * r.src_strides[k],
                               dst_offset=r.dst_offset + i * r.dst_strides[k],
                               src_strides=_with(r.src_strides, k, 0), dst_strides=_with(r.dst_strides, k, 0),
                               size=_with(r.size, k, 1)))
    return out


def _with(triple: tuple[int, int, int], k: int, value: int) -> tuple[int, int, int]:
    out = list(triple)
    out[k] = value
    return out[0], out[1], out[2]


def _assemble_output(b: OnnxBuilder, node: Node, regions: list[Region], shape: list[int],
                     fill: object) -> str | None:
    """The whole output (of `shape`, refined) from boxes, padded with the fill; None when the regions are
    not boxes."""
    regions = _unrolled(b, node, regions)
    shape = _refined(shape, regions)
    boxes = _boxes(regions, shape, dilate=fill is not None)
    if boxes is None:
        return None
    made = _assemble(b, node, boxes, fill)
    if made is None:
        return None
    value, lo, size = made
    if list(size) == shape:
        return value
    if fill is None:
        return None  # the regions promised to cover the output and do not tile it: not boxes after all
    spec = b.graph.specs[node.outputs[0]]
    pads = [*lo, *(n - a - s for n, a, s in zip(shape, lo, size))]
    return b.node("Pad", [value, b.ints(pads, "pads"), b.const(np.array(fill, spec.dtype.np), "fill")],
                  mode="constant")


def _assemble(b: OnnxBuilder, node: Node, boxes: list[_Box],
              fill: object = None) -> tuple[str, tuple[int, ...], tuple[int, ...]] | None:
    """(value, lo, size) of the box that `boxes` tile, by guillotine cuts; None when they do not tile one."""
    if len(boxes) == 1:
        value = _box_value(b, node, boxes[0], fill)
        return None if value is None else (value, boxes[0].lo, boxes[0].size)
    rank = len(boxes[0].lo)
    for axis in range(rank):
        clusters = _clusters(boxes, axis)
        if len(clusters) == 1:
            continue
        if fill is None and any(prev[1] != nxt[0] for prev, nxt in pairwise(clusters)):
            continue  # a gap along this axis with nothing to fill it: try another
        pieces: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
        k = 0
        while k < len(clusters):
            run = _row_run(clusters, k, axis)
            if len(run) >= 2:
                made = _rows_value(b, node, run, axis)
                if made is not None:
                    pieces.append(made)
                    k += len(run)
                    continue
            made = _assemble(b, node, clusters[k][2], fill)
            if made is None:
                return None
            pieces.append(made)
            k += 1
        pieces = _fill_gaps(b, node, pieces, axis, fill)
        if fill is not None:
            pieces = _fill_across(b, node, pieces, axis, fill)
        first = pieces[0]
        if any(p[1][:axis] + p[1][axis + 1:] != first[1][:axis] + first[1][axis + 1:]
               or p[2][:axis] + p[2][axis + 1:] != first[2][:axis] + first[2][axis + 1:] for p in pieces):
            return None  # the slabs do not line up across the other axes
        value = pieces[0][0] if len(pieces) == 1 else b.node("Concat", [p[0] for p in pieces], axis=axis)
        size = list(first[2])
        size[axis] = sum(p[2][axis] for p in pieces)
        return value, first[1], tuple(size)
    return None


def _fill_gaps(b: OnnxBuilder, node: Node, pieces: list[tuple[str, tuple[int, ...], tuple[int, ...]]], axis: int,
               fill: object) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Pieces in order along `axis`, each padded with the fill up to where the next begins."""
    out = []
    for (value, lo, size), nxt in zip(pieces, [*pieces[1:], None]):
        gap = 0 if nxt is None else nxt[1][axis] - lo[axis] - size[axis]
        if gap > 0:
            rank = len(size)
            pads = [0] * (2 * rank)
            pads[rank + axis] = gap
            fill_value = b.const(np.array(fill, b.graph.specs[node.outputs[0]].dtype.np), "fill")
            value = b.node("Pad", [value, b.ints(pads, "pads"), fill_value], mode="constant")
            size = (*size[:axis], size[axis] + gap, *size[axis + 1:])
        out.append((value, lo, size))
    return out


def _fill_across(b: OnnxBuilder, node: Node, pieces: list[tuple[str, tuple[int, ...], tuple[int, ...]]], axis: int,
                 fill: object) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Pieces padded with the fill, across every axis but `axis`, to the box that holds them all: a slab whose
    region leaves a band unwritten (a shifted, zero-padded channel beside full ones) still concatenates."""
    rank = len(pieces[0][1])
    lo = [min(p[1][k] for p in pieces) for k in range(rank)]
    hi = [max(p[1][k] + p[2][k] for p in pieces) for k in range(rank)]
    out = []
    for value, plo, size in pieces:
        pads = [0] * (2 * rank)
        for k in range(rank):
            if k != axis:
                pads[k], pads[rank + k] = plo[k] - lo[k], hi[k] - plo[k] - size[k]
        if any(pads):
            fill_value = b.const(np.array(fill, b.graph.specs[node.outputs[0]].dtype.np), "fill")
            value = b.node("Pad", [value, b.ints(pads, "pads"), fill_value], mode="constant")
            plo = tuple(lo[k] if k != axis else plo[k] for k in range(rank))
            size = tuple(hi[k] - lo[k] if k != axis else size[k] for k in range(rank))
        out.append((value, plo, size))
    return out


def _box_value(b: OnnxBuilder, node: Node, box: _Box, fill: object = None) -> str | None:
    """A value of shape box.size holding what the box's region writes (the fill between stepped elements)."""
    src = node.inputs[box.src]
    view = strided_view(b, src, b.graph.specs[src].numel, box.offset, [(n, s) for _, n, s in box.dims])
    if view is None:
        return None
    counts = [(n - 1) // m + 1 for n, m in zip(box.size, box.steps or [1] * len(box.size))]
    value = b.node("Reshape", [view, b.ints(counts)])
    if not any(step > 1 for step in box.steps):
        return value
    fill_array = np.array(fill, b.graph.specs[node.outputs[0]].dtype.np)  # stepped boxes come with a fill
    if len(counts) == 4 and box.steps[:2] == (1, 1) and box.steps[2] == box.steps[3] > 1 \
            and fill_array.dtype == np.float32:  # ORT's ConvTranspose and DepthToSpace: floats only
        return _spread_spatially(b, value, counts, box.steps[2], fill_array)
    for axis, step in enumerate(box.steps):
        if step > 1:
            value = _dilate(b, value, counts, axis, step, fill_array)
            counts[axis] = box.size[axis]
    return value


def _spread_spatially(b: OnnxBuilder, value: str, shape: list[int], step: int, fill: np.ndarray) -> str:
    """[N, C, H, W] -> [N, C, (H-1)*step+1, (W-1)*step+1], `step - 1` fills after each element of the last two
    axes (a transposed convolution's zero insertion). A zero fill is a depthwise ConvTranspose with a 1x1
    kernel of ones (exact: x * 1); another fill, a Pad of step*step - 1 fill channel blocks then DepthToSpace.
    On the PP-OCRv4 detector's 24x240x240 insertions: Pad per axis 175 ms, DepthToSpace 73, ConvTranspose 13
    (one run under load, ORT's profiler and a micro-benchmark)."""
    _, c, h, w = shape
    if not fill.any():
        ones = b.const(np.ones((c, 1, 1, 1), np.float32), "unit_kernel")
        return b.node("ConvTranspose", [value, ones], group=c, kernel_shape=[1, 1], strides=[step, step])
    pads = [0, 0, 0, 0, 0, c * (step * step - 1), 0, 0]
    spread = b.node("Pad", [value, b.ints(pads, "pads"), b.const(fill, "fill")], mode="constant")
    spread = b.node("DepthToSpace", [spread], blocksize=step, mode="DCR")
    return b.node("Slice", [spread, b.ints([0, 0]), b.ints([(h - 1) * step + 1, (w - 1) * step + 1]),
                            b.ints([2, 3])])


def _dilate(b: OnnxBuilder, value: str, shape: list[int], axis: int, step: int, fill: np.ndarray) -> str:
    """`step - 1` fill elements after each element along `axis` but the last: Reshape, Pad, Reshape, Slice."""
    rank = len(shape)
    split = [*shape[:axis + 1], 1, *shape[axis + 1:]]
    pads = [0] * (2 * (rank + 1))
    pads[rank + 1 + axis + 1] = step - 1
    fill_value = b.const(fill, "fill")
    spread = b.node("Pad", [b.node("Reshape", [value, b.ints(split)]), b.ints(pads, "pads"), fill_value],
                    mode="constant")
    merged = [*shape[:axis], shape[axis] * step, *shape[axis + 1:]]
    flat = b.node("Reshape", [spread, b.ints(merged)])
    return b.node("Slice", [flat, b.ints([0]), b.ints([(shape[axis] - 1) * step + 1]), b.ints([axis])])


def _clusters(boxes: list[_Box], axis: int) -> list[tuple[int, int, list[_Box]]]:
    """Boxes grouped where their intervals along `axis` overlap, in order: (lo, hi, boxes) per group."""
    out: list[tuple[int, int, list[_Box]]] = []
    for box in sorted(boxes, key=lambda x: x.lo[axis]):
        if out and box.lo[axis] < out[-1][1]:
            lo, hi, members = out[-1]
            out[-1] = (lo, max(hi, box.hi(axis)), [*members, box])
        else:
            out.append((box.lo[axis], box.hi(axis), [box]))
    return out


def _other_dims(box: _Box, axis: int) -> tuple[tuple[int, int, int], ...]:
    return tuple(d for d in box.dims if d[0] != axis)


def _row_run(clusters: list[tuple[int, int, list[_Box]]], k: int, axis: int) -> list[_Box]:
    """From clusters[k] on, adjacent boxes that read rows along `axis` from one source alike but for where
    the rows start and their stride: single rows (an unrolled gather), or the before / source / after
    pieces of a reflect or edge pad (reversed and repeated rows)."""
    run: list[_Box] = []
    for lo, _hi, members in clusters[k:]:
        if len(members) != 1 or (run and lo != run[-1].hi(axis)):
            break
        box = members[0]
        if any(step > 1 for step in box.steps) or (run and (box.src != run[0].src or
                                                            _other_dims(box, axis) != _other_dims(run[0], axis))):
            break
        run.append(box)
    return run


def _row_offsets(box: _Box, axis: int) -> np.ndarray:
    """The source offset of each row the box writes along `axis`."""
    count, stride = next(((n, s) for a, n, s in box.dims if a == axis), (1, 0))
    return box.offset + stride * np.arange(count, dtype=np.int64)


def _rows_value(b: OnnxBuilder, node: Node, run: list[_Box], axis: int) -> tuple[str, tuple[int, ...], tuple[int, ...]] | None:
    """Rows i = source view at offset o_i, as one view over the rows read plus Pad / Slice / Gather. Single
    rows take that reading from three on; runs of longer boxes only when they make a reflect or edge pad
    (else each box is its own view). Row numbers are numpy arrays: a pad of an audio axis has 10^4-10^5."""
    first = run[0]
    offsets = np.concatenate([_row_offsets(box, axis) for box in run])
    base = int(offsets.min())
    step = int(np.gcd.reduce(offsets - base))
    if step == 0:
        return None
    rows = (offsets - base) // step
    count = int(rows.max()) + 1
    single = len(offsets) == len(run)
    if (single and len(run) < 3) or (not single and _pad_of(rows, count) is None):
        return None
    src = node.inputs[first.src]
    dims = sorted([*_other_dims(first, axis), (axis, count, step)])
    view = strided_view(b, src, b.graph.specs[src].numel, base, [(n, s) for _, n, s in dims])
    if view is None:
        return None
    full = list(first.size)
    full[axis] = count
    view = b.node("Reshape", [view, b.ints(full)])
    value = _pick_rows(b, view, rows, count, axis, len(full))
    size = list(first.size)
    size[axis] = len(rows)
    return value, first.lo, tuple(size)


def _pad_of(rows: np.ndarray, count: int) -> tuple[str, int, int] | None:
    """(mode, before, after) when `rows` is a reflect or edge padding of range(count)."""
    zeros = np.flatnonzero(rows == 0)
    for mode in ("reflect", "edge"):
        before = (int(zeros[0]) if len(zeros) else -1) if mode == "reflect" else len(zeros) - 1
        after = len(rows) - before - count
        if before >= 0 and after >= 0 and np.array_equal(rows, _pad_rows(count, before, after, mode)):
            return mode, before, after
    return None


def _pick_rows(b: OnnxBuilder, view: str, rows: np.ndarray, count: int, axis: int, rank: int) -> str:
    """view[..., rows, ...] along `axis` (of `count` rows): a Pad when `rows` is a reflect or edge padding of
    range(count), else stepped Slices, else a Gather with this small per-row index."""
    pad = _pad_of(rows, count)
    if pad is not None:
        mode, before, after = pad
        pads = [0] * (2 * rank)
        pads[axis], pads[rank + axis] = before, after
        return b.node("Pad", [view, b.ints(pads, "pads")], mode=mode)
    runs = _arithmetic_runs(rows.tolist())
    if len(runs) > MAX_SLICE_RUNS:
        return b.node("Gather", [view, b.ints(rows.tolist(), "row_index")], axis=axis)
    pieces = []
    for start, n, step in runs:
        if step == 1 and start == 0 and n == count:
            pieces.append(view)
            continue
        end = start + n * step
        end = INT64_MIN if end < 0 else end  # a reversing slice down to row 0 inclusive
        pieces.append(b.node("Slice", [view, b.ints([start]), b.ints([end]), b.ints([axis]), b.ints([step or 1])]))
    return pieces[0] if len(pieces) == 1 else b.node("Concat", pieces, axis=axis)


def _pad_rows(n: int, before: int, after: int, mode: str) -> np.ndarray:
    middle = np.arange(n)
    if mode == "edge":
        return np.concatenate([np.zeros(before, np.int64), middle, np.full(after, n - 1)])
    if before >= n or after >= n:
        return np.zeros(0, np.int64)
    return np.concatenate([np.arange(before, 0, -1), middle, np.arange(n - 2, n - 2 - after, -1)])


def _arithmetic_runs(rows: list[int]) -> list[tuple[int, int, int]]:
    """Split `rows` into maximal (start, count, step) runs with a nonzero step (a repeated row: count 1)."""
    runs: list[tuple[int, int, int]] = []
    k = 0
    while k < len(rows):
        n = 1
        step = rows[k + 1] - rows[k] if k + 1 < len(rows) else 1
        if step == 0:
            step = 1
        else:
            while k + n < len(rows) and rows[k + n] - rows[k + n - 1] == step:
                n += 1
        runs.append((rows[k], n, step))
        k += n
    return runs
