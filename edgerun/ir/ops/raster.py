"""Raster: the one data-movement op (MNN's geometric computing).

A raster node reads one or more source tensors and writes one output of shape `attrs["shape"]`. It is a list
of regions, each twelve integers:

    [src, src_offset, ss0, ss1, ss2, dst_offset, ds0, ds1, ds2, n0, n1, n2]

meaning: for i < n0, j < n1, k < n2:
    out.flat[dst_offset + i*ds0 + j*ds1 + k*ds2] = inputs[src].flat[src_offset + i*ss0 + j*ss1 + k*ss2]

Offsets and strides are in elements of the row-major (contiguous) layout. Regions apply in order. Elements
that no region writes take `attrs["fill"]`; a fill of None promises that the regions cover the output.
Transpose, reshape, slice, concat, split, pad, expand and every other layout op decompose into rasters, so
a backend implements data movement once, and the raster-merging pass can fuse chains of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.tensor_spec import TensorSpec

REGION_LEN = 12
Region = list[int]


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
    for r in regions:
        if len(r) != REGION_LEN:
            raise ValueError(f"raster region needs {REGION_LEN} integers, got {list(r)}")
        src, soff, s0, s1, s2, doff, d0, d1, d2, n0, n1, n2 = (int(v) for v in r)
        if not 0 <= src < len(src_sizes):
            raise ValueError(f"raster region reads source {src} of {len(src_sizes)}")
        if min(n0, n1, n2) < 0:
            raise ValueError(f"raster region has a negative size: {list(r)}")
        if n0 * n1 * n2 == 0:
            continue
        for off, strides, limit, what in ((soff, (s0, s1, s2), src_sizes[src], "source"),
                                          (doff, (d0, d1, d2), dst_size, "output")):
            lo = off + sum(min(0, s * (n - 1)) for s, n in zip(strides, (n0, n1, n2)))
            hi = off + sum(max(0, s * (n - 1)) for s, n in zip(strides, (n0, n1, n2)))
            if lo < 0 or hi >= limit:
                raise ValueError(f"raster region {list(r)} leaves its {what} (elements {lo}..{hi} of {limit})")


register(OpDef("raster", OpKind.RASTER, _raster_rule, 1, None,
               doc="the one data-movement op: copy strided 3-D regions of sources into one output"))


# ---- building regions --------------------------------------------------------------------------------

def strided_copy_regions(src: int, src_offset: int, src_strides: Sequence[int], dst_offset: int,
                         dst_strides: Sequence[int], sizes: Sequence[int]) -> list[Region]:
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
    regions: list[Region] = []
    outer_count = math.prod(n for n, _, _ in outer)
    for flat in range(outer_count):
        so, do = src_offset, dst_offset
        rem = flat
        for n, s, d in reversed(outer):
            rem, i = divmod(rem, n)
            so += i * s
            do += i * d
        regions.append([src, so, keep[0][1], keep[1][1], keep[2][1],
                        do, keep[0][2], keep[1][2], keep[2][2], keep[0][0], keep[1][0], keep[2][0]])
    return regions


def region_count_elements(regions: Sequence[Sequence[int]]) -> int:
    return sum(int(r[9]) * int(r[10]) * int(r[11]) for r in regions)
