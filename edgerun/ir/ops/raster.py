"""Raster: the one data-movement op (MNN's geometric computing).

A raster node reads one or more source tensors and writes one output of shape `attrs["shape"]`. It is a list
of regions (edgerun.ir.region.Region: stored as twelve integers, read by name). Offsets and strides are in elements of the row-major (contiguous) layout. Regions apply in order. Elements
that no region writes take `attrs["fill"]`; a fill of None promises that the regions cover the output.
Transpose, reshape, slice, concat, split, pad, expand and every other layout op decompose into rasters, so
a backend implements data movement once, and the raster-merging pass can fuse chains of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.region import Region
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.tensor_spec import TensorSpec

# A region as stored in node attrs: Region.to_list()'s twelve integers.
StoredRegion = list[int]


def _raster_rule(ins: list[TensorSpec], attrs: dict[str, Any]) -> list[TensorSpec]:
    shape = tuple(int(d) for d in attrs["shape"])
    dtype = DType(attrs.get("dtype") or ins[0].dtype)
    if any(s.dtype is not dtype for s in ins):
        raise ValueError("raster sources must all have the output dtype")
    out = TensorSpec(shape, dtype)
    check_regions(attrs["regions"], [s.numel for s in ins], out.numel)
    return [out]


def check_regions(regions: Sequence[Sequence[int]], src_sizes: Sequence[int], dst_size: int) -> None:
    """Every region stays inside its source and the output; ValueError naming the first that does not."""
    for stored in regions:
        r = Region.of(stored)
        if not 0 <= r.src < len(src_sizes):
            raise ValueError(f"raster region reads source {r.src} of {len(src_sizes)}")
        if min(r.size) < 0:
            raise ValueError(f"raster region has a negative size: {list(stored)}")
        if r.numel == 0:
            continue
        for side, limit, what in (("src", src_sizes[r.src], "source"), ("dst", dst_size, "output")):
            lo, hi = r.extent(side)
            if lo < 0 or hi >= limit:
                raise ValueError(f"raster region {list(stored)} leaves its {what} (elements {lo}..{hi} of {limit})")


register(OpDef("raster", OpKind.RASTER, _raster_rule, 1, None,
               doc="the one data-movement op: copy strided 3-D regions of sources into one output"))


# ---- building regions --------------------------------------------------------------------------------

def strided_copy_regions(src: int, src_offset: int, src_strides: Sequence[int], dst_offset: int,
                         dst_strides: Sequence[int], sizes: Sequence[int]) -> list[StoredRegion]:
    """Regions copying an N-d strided view of a source into an N-d strided view of the output.

    Unit dimensions are dropped and dimensions that are contiguous in both views are merged. When more than
    three remain, the three largest stay in the region and the rest are unrolled into one region each.
    """
    dims = [(int(n), int(s), int(d)) for n, s, d in zip(sizes, src_strides, dst_strides) if n != 1]
    if any(n == 0 for n, _, _ in dims):
        return []
    merged: list[tuple[int, int, int]] = []
    for n, s, d in dims:
        if merged:
            pn, ps, pd = merged[-1]
            if ps == s * n and pd == d * n:
                merged[-1] = (pn * n, s, d)
                continue
        merged.append((n, s, d))
    if len(merged) <= 3:
        keep = merged
        outer: list[tuple[int, int, int]] = []
    else:
        order = sorted(range(len(merged)), key=lambda i: -merged[i][0])
        kept_idx = sorted(order[:3])
        keep = [merged[i] for i in kept_idx]
        outer = [merged[i] for i in range(len(merged)) if i not in kept_idx]
    while len(keep) < 3:
        keep.insert(0, (1, 0, 0))
    regions: list[StoredRegion] = []
    outer_count = math.prod(n for n, _, _ in outer)
    for flat in range(outer_count):
        so, do = src_offset, dst_offset
        rem = flat
        for n, s, d in reversed(outer):
            rem, i = divmod(rem, n)
            so += i * s
            do += i * d
        regions.append(Region(src, so, (keep[0][1], keep[1][1], keep[2][1]), do, (keep[0][2], keep[1][2], keep[2][2]),
                              (keep[0][0], keep[1][0], keep[2][0])).to_list())
    return regions


def region_count_elements(regions: Sequence[Sequence[int]]) -> int:
    return sum(Region.of(r).numel for r in regions)
