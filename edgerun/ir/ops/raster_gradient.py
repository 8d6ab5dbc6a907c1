"""The raster's vector-Jacobian product: its transpose, a raster from the output's cotangent back into each
source, summing where the forward copied one source element to several places.

A region's transpose swaps its source and destination sides. Where the forward region reads one element
more than once (a stride-0 axis: expand, broadcast), the cotangent is first copied out whole and summed over
those axes; any other repeated read is split into smaller regions until each reads an element once. Regions
whose source elements overlap cannot share one raster (a raster copies, it does not add), so they are put
in groups of disjoint regions, one raster each, and the groups' rasters are added. Where the forward wrote
an output element twice, only the last write is live, so an earlier region's share of the cotangent is
masked first. Everything is decided from the static regions at differentiation time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.graph import Node
from edgerun.ir.region import Region, regions_of
from edgerun.ir.registry import register_gradient

Grads = list[str | None]


def _strides(size: tuple[int, int, int]) -> tuple[int, int, int]:
    return (size[1] * size[2], size[2], 1)


def _src_injective(r: Region) -> bool:
    _, src = r.index_grids()
    return int(np.unique(src).size) == src.size


def _dst_injective(r: Region) -> bool:
    dst, _ = r.index_grids()
    return int(np.unique(dst).size) == dst.size


def _last_writes(r: Region) -> list[Region]:
    """`r` as pieces in its own loop order, each writing every element once: an axis that writes one element
    repeatedly (destination stride 0) keeps its last step only, the last write being the live one."""
    if r.numel == 0 or _dst_injective(r):
        return [r] if r.numel else []
    size = list(r.size)
    offset = r.src_offset
    for a in range(3):
        if r.dst_strides[a] == 0 and size[a] > 1:
            offset += (size[a] - 1) * r.src_strides[a]
            size[a] = 1
    shrunk = Region(r.src, offset, r.src_strides, r.dst_offset, r.dst_strides, (size[0], size[1], size[2]))
    if _dst_injective(shrunk):
        return [shrunk]
    return [p for piece in _cut(shrunk) for p in _last_writes(piece)]


def _cut(r: Region) -> list[Region]:
    """`r` cut into one piece per step of its outermost axis longer than 1, in loop order."""
    axis = next(i for i, n in enumerate(r.size) if n > 1)
    pieces = []
    for i in range(r.size[axis]):
        size = list(r.size)
        size[axis] = 1
        pieces.append(Region(r.src, r.src_offset + i * r.src_strides[axis], r.src_strides,
                             r.dst_offset + i * r.dst_strides[axis], r.dst_strides, (size[0], size[1], size[2])))
    return pieces


def _split_injective(r: Region) -> list[Region]:
    """`r` cut along its outermost axis longer than 1 until every piece reads each source element once."""
    if r.numel == 0 or _src_injective(r):
        return [r] if r.numel else []
    return [p for piece in _cut(r) for p in _split_injective(piece)]


def _live_masks(regions: Sequence[Region], out_numel: int) -> list[np.ndarray | None]:
    """Per region, None when every element it writes is live (no later region overwrites it), else a 0/1 mask
    over the output of the elements it wrote last."""
    if sum(r.numel for r in regions) <= out_numel:
        owner = np.full(out_numel, -1, np.int64)
        seen = np.zeros(out_numel, bool)
        overlap = False
        for i, r in enumerate(regions):
            dst, _ = r.index_grids()
            overlap |= bool(seen[dst].any())
            seen[dst] = True
            owner[dst] = i
        if not overlap:
            return [None] * len(regions)
    owner = np.full(out_numel, -1, np.int64)
    for i, r in enumerate(regions):
        owner[r.index_grids()[0]] = i
    masks: list[np.ndarray | None] = []
    for i, r in enumerate(regions):
        dst, _ = r.index_grids()
        masks.append(None if bool((owner[dst] == i).all()) else (owner == i))
    return masks


def transpose_regions(b: Builder, g: str, regions: Sequence[Region], source_index: int,
                      source_shape: Sequence[int], every_write_live: bool = False) -> str | None:
    """The cotangent of raster source `source_index` (shape `source_shape`) from the output's cotangent `g`
    under `regions` (the forward's, in order); None when no region reads that source.

    `every_write_live`: each region carries the whole cotangent of what it writes even where regions write
    the same element (a sum of copies, as a pooling window's taps are, rather than a raster's overwrite)."""
    out_shape = b.shape(g)
    out_numel = int(np.prod(out_shape))
    if not every_write_live:
        regions = [p for r in regions for p in _last_writes(r)]
    masks = [None] * len(regions) if every_write_live else _live_masks(regions, out_numel)
    # (value read, region from that value into the source's cotangent), every region reading each element once
    pieces: list[tuple[str, Region]] = []
    masked: dict[int, str] = {}
    for i, r in enumerate(regions):
        if r.src != source_index or r.numel == 0:
            continue
        value = g
        mask = masks[i]
        if mask is not None:
            if i not in masked:
                masked[i] = b.binary("mul", g, b.const(mask.reshape(out_shape).astype(b.dtype(g).np), b.dtype(g)))
            value = masked[i]
        repeated = [a for a in range(3) if r.src_strides[a] == 0 and r.size[a] > 1]
        if repeated:  # copy the region's cotangent out whole, sum the axes that read one element repeatedly
            block = b.emit("raster", [value], shape=list(r.size), fill=None, regions=[
                Region(0, r.dst_offset, r.dst_strides, 0, _strides(r.size), r.size).to_list()])
            summed = b.emit("reduce_sum", [block], axes=repeated, keepdims=True)
            size = (1 if 0 in repeated else r.size[0], 1 if 1 in repeated else r.size[1],
                    1 if 2 in repeated else r.size[2])
            for p in _split_injective(Region(r.src, r.src_offset, r.src_strides, 0, _strides(size), size)):
                pieces.append((summed, p))
            continue
        for p in _split_injective(r):
            pieces.append((value, p))
    if not pieces:
        return None
    numel = int(np.prod(source_shape))
    groups: list[tuple[np.ndarray, list[tuple[str, Region]]]] = []
    for value, p in pieces:
        _, src = p.index_grids()
        for covered, members in groups:
            if not covered[src].any():
                covered[src] = True
                members.append((value, p))
                break
        else:
            covered = np.zeros(numel, bool)
            covered[src] = True
            groups.append((covered, [(value, p)]))
    total: str | None = None
    for covered, members in groups:
        inputs: list[str] = []
        stored = []
        for value, p in members:
            if value not in inputs:
                inputs.append(value)
            # transposed: read the forward's destination side of `value`, write the forward's source side
            stored.append(Region(inputs.index(value), p.dst_offset, p.dst_strides, p.src_offset, p.src_strides,
                                 p.size).to_list())
        full = bool(covered.all())
        part = b.emit("raster", inputs, shape=list(source_shape), fill=None if full else 0.0, regions=stored)
        total = part if total is None else b.binary("add", total, part)
    return total


@register_gradient("raster")
def _raster(b: Builder, node: Node, grads: Grads, needs: list[bool]) -> Grads:
    g = grads[0]
    if g is None:
        return [None] * len(node.inputs)
    regions = regions_of(node.attrs)
    return [transpose_regions(b, g, regions, i, b.shape(src)) if need else None
            for i, (src, need) in enumerate(zip(node.inputs, needs))]
