"""Raster as ONNX: a Slice/Reshape/Transpose/Expand/Concat pattern read from the regions where one exists,
else a Gather with a constant index (always correct, one index per output element).

A region is a strided 3-D view of a flat source written into a strided 3-D view of the flat output. The
source view is a Reshape + stepped Slice of the flat source when its strides nest (blocks of gcd sizes that
the dimensions do not overrun); zero strides are an Expand and negative ones a reversing Slice. The
destination is a Transpose + Reshape when the region writes a whole box of the output in some dimension
order, and several regions that each fill one slab along an axis, in order, are a Concat of such boxes.
The patterns cover reshape, transpose, slice, broadcast, flip and concat; pad (a fill) and other
multi-region rasters use the gather.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import pairwise

import numpy as np

from edgerun.backends.onnxruntime.onnx_ops import OnnxBuilder
from edgerun.ir.graph import Node

INT64_MIN = np.iinfo(np.int64).min


def emit_raster(b: OnnxBuilder, node: Node) -> None:
    out = node.outputs[0]
    shape = list(b.graph.specs[out].shape)
    regions = [[int(v) for v in r] for r in node.attrs["regions"] if int(r[9]) * int(r[10]) * int(r[11])]
    if node.attrs.get("fill") is None and regions:
        mark = (len(b.nodes), len(b.initializers))
        if len(regions) == 1:
            piece = _region_as_box(b, node, regions[0], shape, shape)
            if piece is not None:
                b.node("Identity", [piece], [out])
                return
        elif _emit_concat(b, node, regions, shape, out):
            return
        else:
            # Interleaved slabs (a channel shuffle fused with its concat) are slabs of a finer view of
            # the output: [C/2, 2, HW] instead of [C, HW]. Concat there, then reshape.
            finer = _finer_shape(regions[0], math.prod(shape))
            if finer is not None and finer != shape:
                joined = b.fresh("interleaved")
                if _emit_concat(b, node, regions, finer, joined):
                    b.node("Reshape", [joined, b.ints(shape)], [out])
                    return
        del b.nodes[mark[0]:], b.initializers[mark[1]:]  # a pattern that did not fit leaves nothing behind
    _emit_gather(b, node, regions, node.attrs.get("fill"))


def _finer_shape(region: list[int], numel: int) -> list[int] | None:
    """The output's shape refined so `region`'s destination is a box: its dimensions plus the gaps between."""
    shape = []
    outer = numel
    for n, d in _merged(list(zip(region[9:12], region[6:9]))):
        if outer % (n * d):
            return None
        shape += [outer // (n * d), n]
        outer = d
    shape.append(outer)
    return [s for s in shape if s != 1] or [1]


def _emit_concat(b: OnnxBuilder, node: Node, regions: list[list[int]], shape: list[int], out: str) -> bool:
    """Regions that each fill a slab out[..., lo:hi, ...] of one axis, tiling it in order: a Concat."""
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    rest = math.prod(shape)
    for axis, size in enumerate(shape):
        if size == 1 or rest % size:
            continue
        others = rest // size
        slabs = []
        for r in regions:
            lo, misplaced = divmod(r[5], strides[axis])
            count = r[9] * r[10] * r[11]
            if misplaced or count % others:
                break
            slabs.append((lo, count // others, r))
        else:
            slabs.sort(key=lambda t: t[0])
            if [lo for lo, _, _ in slabs] != [sum(h for _, h, _ in slabs[:k]) for k in range(len(slabs))] \
                    or sum(h for _, h, _ in slabs) != size:
                continue
            pieces = []
            for _, height, r in slabs:
                piece = _region_as_box(b, node, r, [*shape[:axis], height, *shape[axis + 1:]], shape)
                if piece is None:
                    return False
                pieces.append(piece)
            b.node("Concat", pieces, [out], axis=axis)
            return True
    return False


def _merged(dims: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(size, stride) pairs without unit sizes, by decreasing stride, contiguous neighbours merged."""
    out: list[tuple[int, int]] = []
    for n, d in sorted(((n, d) for n, d in dims if n != 1), key=lambda t: -t[1]):
        if out and out[-1][1] == d * n:
            out[-1] = (out[-1][0] * n, d)
        else:
            out.append((n, d))
    return out


def _region_as_box(b: OnnxBuilder, node: Node, region: list[int], box: list[int], shape: list[int]) -> str | None:
    """A value of shape `box` holding what `region` writes, when it writes exactly the box of that shape at
    its destination offset inside the row-major output of `shape`; else None."""
    src_index, soff, s0, s1, s2, _, d0, d1, d2, n0, n1, n2 = region
    dims = [(n, s, d) for n, s, d in zip((n0, n1, n2), (s0, s1, s2), (d0, d1, d2)) if n != 1]
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    if len({d for _, _, d in dims}) != len(dims) or \
            _merged([(n, d) for n, _, d in dims]) != _merged(list(zip(box, strides))):
        return None
    src = node.inputs[src_index]
    view = _strided_view(b, src, b.graph.specs[src].numel, soff, [(n, s) for n, s, _ in dims])
    if view is None:
        return None
    dst_order = sorted(range(len(dims)), key=lambda k: -dims[k][2])
    if dst_order != sorted(dst_order):
        view = b.node("Transpose", [view], perm=dst_order)
    return b.node("Reshape", [view, b.ints(box)])


def _strided_view(b: OnnxBuilder, src: str, src_numel: int, offset: int,
                  dims: list[tuple[int, int]]) -> str | None:
    """A value of shape [n for n, _ in dims] holding src.flat[offset + sum(i_k * stride_k)], or None."""
    shape = [n for n, _ in dims]
    reversed_axes = []
    moving: list[tuple[int, int, int]] = []  # (axis, n, positive stride)
    for axis, (n, s) in enumerate(dims):
        if s < 0:
            offset += s * (n - 1)
            reversed_axes.append(axis)
        if s != 0:
            moving.append((axis, n, abs(s)))
    order = sorted(range(len(moving)), key=lambda k: -moving[k][2])
    strides = [moving[k][2] for k in order]
    counts = [moving[k][1] for k in order]
    if len(set(strides)) != len(strides):
        return None
    flat = b.node("Reshape", [src, b.ints([-1])])
    if not moving:
        view = b.node("Slice", [flat, b.ints([offset]), b.ints([offset + 1]), b.ints([0])])
        view_shape: list[int] = []
    else:
        nested, view_shape = _nested_slice(b, flat, src_numel, offset, strides, counts)
        if nested is None:
            return None
        view = nested
        inverse = [0] * len(order)
        for pos, k in enumerate(order):
            inverse[k] = pos
        if inverse != sorted(inverse):
            view = b.node("Transpose", [view], perm=inverse)
            view_shape = [view_shape[k] for k in inverse]
    if reversed_axes:
        moving_pos = {axis: pos for pos, (axis, _, _) in enumerate(moving)}
        axes = [moving_pos[a] for a in reversed_axes]
        view = b.node("Slice", [view, b.ints([-1] * len(axes)), b.ints([INT64_MIN] * len(axes)), b.ints(axes),
                                b.ints([-1] * len(axes))])
    if len(moving) != len(dims):
        broadcastable = [n if s != 0 else 1 for n, s in dims]
        view = b.node("Reshape", [view, b.ints(broadcastable)])
        view = b.node("Expand", [view, b.ints(shape)])
    elif view_shape != shape:
        view = b.node("Reshape", [view, b.ints(shape)])
    return view


def _nested_slice(b: OnnxBuilder, flat: str, src_numel: int, offset: int, strides: list[int],
                  counts: list[int]) -> tuple[str | None, list[int]]:
    """Reshape the flat source into nested blocks and slice (with steps) each digit of `offset` out of it.

    Block sizes are B0 = s0 and Bk = gcd(sk, Bk-1), so dimension k walks its block with step sk / Bk;
    the view fits when every dimension's last index stays inside its block.
    """
    blocks = [strides[0]]
    for stride in strides[1:]:
        blocks.append(math.gcd(stride, blocks[-1]))
    q0, rem = divmod(offset, blocks[0])
    if (q0 + counts[0]) * blocks[0] > src_numel:
        return None, []
    shape = [counts[0]] + [big // small for big, small in pairwise(blocks)] + [blocks[-1]]
    starts, ends, steps = [0], [counts[0]], [1]
    for k in range(1, len(strides)):
        digit, rem = divmod(rem, blocks[k])
        step = strides[k] // blocks[k]
        end = digit + (counts[k] - 1) * step + 1
        if end > shape[k]:
            return None, []
        starts.append(digit)
        ends.append(end)
        steps.append(step)
    starts.append(rem)
    ends.append(rem + 1)
    steps.append(1)
    view = flat
    if q0 != 0 or counts[0] * blocks[0] != src_numel:
        view = b.node("Slice", [flat, b.ints([q0 * blocks[0]]), b.ints([(q0 + counts[0]) * blocks[0]]),
                                b.ints([0])])
    view = b.node("Reshape", [view, b.ints(shape)])
    cut = [k for k in range(len(shape)) if starts[k] != 0 or ends[k] != shape[k] or steps[k] != 1]
    if cut:
        view = b.node("Slice", [view, b.ints([starts[k] for k in cut]), b.ints([ends[k] for k in cut]),
                                b.ints(cut), b.ints([steps[k] for k in cut])])
    return b.node("Reshape", [view, b.ints(counts)]), counts


def _emit_gather(b: OnnxBuilder, node: Node, regions: list[list[int]], fill: object) -> None:
    """Gather from the concatenation of each region's elements (its strided view where one exists, else
    its whole flat source) and a fill element, with one constant index per output element: the data
    concatenated is about the output's size, not the sum of the sources'."""
    out_spec = b.graph.specs[node.outputs[0]]
    pieces: list[str] = []
    whole: dict[int, int] = {}  # source -> its base in the concatenation, when copied whole
    base = 0
    placed: list[tuple[np.ndarray, np.ndarray]] = []  # (output positions, data positions), in region order
    for src, soff, s0, s1, s2, doff, d0, d1, d2, n0, n1, n2 in regions:
        i, j, k = np.ogrid[:n0, :n1, :n2]
        dst = (doff + i * d0 + j * d1 + k * d2).ravel()
        name = node.inputs[src]
        dims = [(n, st) for n, st in zip((n0, n1, n2), (s0, s1, s2)) if n != 1]
        view = _strided_view(b, name, b.graph.specs[name].numel, soff, dims) if dims else None
        if view is not None:
            pieces.append(b.node("Reshape", [view, b.ints([-1])]))
            placed.append((dst, base + np.arange(dst.size)))
            base += dst.size
            continue
        if src not in whole:
            whole[src] = base
            pieces.append(b.node("Reshape", [name, b.ints([-1])]))
            base += b.graph.specs[name].numel
        placed.append((dst, (whole[src] + soff + i * s0 + j * s1 + k * s2).ravel()))
    index_dtype = np.int32 if base + 1 < 2**31 else np.int64
    index = np.full(out_spec.numel, base, index_dtype)  # the fill element sits after the last piece
    for dst, positions in placed:
        index[dst] = positions
    fill_value = np.zeros(1, out_spec.dtype.np) if fill is None else np.full(1, fill, out_spec.dtype.np)
    pieces.append(b.const(fill_value, "fill"))
    joined = b.node("Concat", pieces, axis=0)
    gathered = b.node("Gather", [joined, b.const(index, "raster_index")], axis=0)
    b.node("Reshape", [gathered, b.ints(list(out_spec.shape))], [node.outputs[0]])
