"""The raster readings that permute through a Gather, for rasters that no box assembly expresses (see
onnx_raster.py for the boxes, tried first):

2. **Rows.** When every region copies whole rows of R contiguous elements (R at least MIN_ROW: channel rows
   of H*W floats, say), each region is a strided view of its source as rows, the views are concatenated, and
   one Gather along the rows puts them in place, with an index of one int64 per output row, worked out here
   at emission. That is what a chain of channel shuffles merged with their concats and splits is (each
   output channel is a channel of one of many earlier values): one copy per row, not an index per element.
3. **A computed gather** for the rest (overlapping or irregular regions): the regions' elements, each region
   a view or an index computed from Range and arithmetic, concatenated with the fill; the gather index is
   scattered from per-region index ranges computed the same way. The model stores a few integers per region,
   never one per element; the delegate folds them at session creation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgerun.backends.onnxruntime.onnx_ops import OnnxBuilder
from edgerun.backends.onnxruntime.onnx_views import strided_view
from edgerun.ir.graph import Node
from edgerun.ir.region import Region, copied_elements

# Rows shorter than this are left to the computed gather: a Gather of 4-float rows is an element gather in
# all but name, and its stored index would be a quarter of the tensor.
MIN_ROW = 16


# ---- 2. rows --------------------------------------------------------------------------------------------

def row_length(regions: Sequence[Region], out_numel: int, src_numels: Sequence[int]) -> int:
    """The longest R such that every region copies whole rows of R elements, row-aligned on both sides: each
    region has one contiguous dimension (unit stride in source and output) whose length R divides, and R
    divides every offset and every other stride. 1 when some region has no such dimension."""
    g = math.gcd(out_numel, *src_numels)
    for r in regions:
        inner = [k for k in range(3) if r.size[k] > 1 and r.src_strides[k] == 1 and r.dst_strides[k] == 1]
        if len(inner) != 1:
            return 1
        others = [s for k in range(3) if k != inner[0] and r.size[k] > 1
                  for s in (r.src_strides[k], r.dst_strides[k])]
        g = math.gcd(g, r.size[inner[0]], r.src_offset, r.dst_offset, *others)
    return g


def emit_row_gather(b: OnnxBuilder, node: Node, regions: Sequence[Region], fill: object) -> bool:
    """The raster as row views, a Concat and one row Gather; False (nothing emitted) where it does not fit."""
    out_spec = b.graph.specs[node.outputs[0]]
    row = row_length(regions, out_spec.numel, [b.graph.specs[node.inputs[r.src]].numel for r in regions])
    if row < MIN_ROW:
        return False
    mark = (len(b.nodes), len(b.initializers))
    pieces: list[str] = []
    index = np.full(out_spec.numel // row, copied_elements(regions) // row, np.int64)  # the fill row, for now
    base = 0
    for r in regions:
        inner = next(k for k in range(3) if r.size[k] > 1 and r.src_strides[k] == 1 and r.dst_strides[k] == 1)
        outer = [k for k in range(3) if k != inner and r.size[k] > 1]
        chunks = r.size[inner] // row
        dims = [*((r.size[k], r.src_strides[k]) for k in outer), (chunks, row), (row, 1)]
        dims = [(n, s) for n, s in dims if n > 1]  # a length-1 dimension's stride could repeat another's
        name = node.inputs[r.src]
        view = strided_view(b, name, b.graph.specs[name].numel, r.src_offset, dims)
        if view is None:
            del b.nodes[mark[0]:], b.initializers[mark[1]:]
            return False
        pieces.append(b.node("Reshape", [view, b.ints([-1, row])]))
        # Output row of each viewed row, in the view's order (outer dimensions, then the chunks).
        dst = np.full((1,), r.dst_offset, np.int64)
        for n, d in [*((r.size[k], r.dst_strides[k]) for k in outer), (chunks, row)]:
            dst = (dst[:, None] + np.arange(n, dtype=np.int64) * d).reshape(-1)
        index[dst // row] = base + np.arange(dst.size, dtype=np.int64)  # later regions win, as in the raster
        base += dst.size
    if (index == base).any():  # rows no region writes: the fill (zeros when the raster names none)
        value = 0 if fill is None else fill
        pieces.append(b.const(np.full((1, row), value, out_spec.dtype.np), "fill_row"))
    rows = pieces[0] if len(pieces) == 1 else b.node("Concat", pieces, axis=0)
    if not np.array_equal(index, np.arange(index.size)):
        rows = b.node("Gather", [rows, b.ints(index.tolist(), "row_index")], axis=0)
    b.node("Reshape", [rows, b.ints(list(out_spec.shape))], [node.outputs[0]])
    return True


# ---- 3. the computed gather -------------------------------------------------------------------------------

def _scalar(b: OnnxBuilder, value: int) -> str:
    """A 0-d int64 initializer (OnnxBuilder.const would make it 1-d; Range wants true scalars)."""
    name = b.fresh("n")
    b.initializers.append(b.numpy_helper.from_array(np.array(value, np.int64), name))
    return name


def _affine_index(b: OnnxBuilder, offset: int, strides: Sequence[int], sizes: Sequence[int]) -> str:
    """A flat int64 value: offset + i*s0 + j*s1 + k*s2 over the 3-D region, computed from Range nodes."""
    total: str | None = None
    for axis, (s, n) in enumerate(zip(strides, sizes)):
        if n == 1 or s == 0:
            continue
        steps = b.node("Range", [_scalar(b, 0), _scalar(b, n * s), _scalar(b, s)])
        shape = [1, 1, 1]
        shape[axis] = n
        steps = b.node("Reshape", [steps, b.ints(shape)])
        total = steps if total is None else b.node("Add", [total, steps])
    base = _scalar(b, offset)
    total = base if total is None else b.node("Add", [total, base])
    full = b.node("Expand", [total, b.ints(list(sizes))])
    return b.node("Reshape", [full, b.ints([-1])])


def emit_computed_gather(b: OnnxBuilder, node: Node, regions: Sequence[Region], fill: object) -> None:
    """out.flat[p] = data[index[p]], data = each region's elements in order then the fill element; index is
    the fill's position scattered over by each region's destination range, in region order (later wins)."""
    out_spec = b.graph.specs[node.outputs[0]]
    numel = out_spec.numel
    pieces: list[str] = []
    destinations: list[str] = []
    overlap = _regions_overlap(regions, numel)
    index = b.node("Expand", [_scalar(b, copied_elements(regions)), b.ints([numel])])
    base = 0
    for r in regions:
        name = node.inputs[r.src]
        dims = [(n, st) for n, st in zip(r.size, r.src_strides) if n != 1]
        view = strided_view(b, name, b.graph.specs[name].numel, r.src_offset, dims) if dims else None
        if view is None:
            flat = b.node("Reshape", [name, b.ints([-1])])
            view = b.node("Gather", [flat, _affine_index(b, r.src_offset, r.src_strides, r.size)], axis=0)
        pieces.append(b.node("Reshape", [view, b.ints([-1])]))
        dst = _affine_index(b, r.dst_offset, r.dst_strides, r.size)
        if overlap:  # one scatter per region keeps "later regions win" without relying on duplicate order
            positions = b.node("Range", [_scalar(b, base), _scalar(b, base + r.numel), _scalar(b, 1)])
            index = b.node("ScatterElements", [index, dst, positions], axis=0)
        destinations.append(dst)
        base += r.numel
    if not overlap and destinations:
        dst = destinations[0] if len(destinations) == 1 else b.node("Concat", destinations, axis=0)
        positions = b.node("Range", [_scalar(b, 0), _scalar(b, base), _scalar(b, 1)])
        index = b.node("ScatterElements", [index, dst, positions], axis=0)
    fill_value = np.zeros(1, out_spec.dtype.np) if fill is None else np.full(1, fill, out_spec.dtype.np)
    pieces.append(b.const(fill_value, "fill"))
    joined = b.node("Concat", pieces, axis=0)
    index = b.node("Identity", [index], [b.fresh("raster_index")])
    gathered = b.node("Gather", [joined, index], axis=0)
    b.node("Reshape", [gathered, b.ints(list(out_spec.shape))], [node.outputs[0]])


def _regions_overlap(regions: Sequence[Region], numel: int) -> bool:
    """Whether two regions write the same output element (checked on the destination offsets at load)."""
    written = np.zeros(numel, np.uint8)
    for r in regions:
        dst, _ = r.index_grids()
        if written[dst].any() or np.unique(dst).size != dst.size:
            return True
        written[dst] = 1
    return False
