"""Region: one strided 3-D copy of a raster, with named fields and the helpers every user of rasters needs.

In a program file (and in node attrs) a region is twelve integers, so graphs stay plain JSON:

    [src, src_offset, ss0, ss1, ss2, dst_offset, ds0, ds1, ds2, n0, n1, n2]

meaning: for i < n0, j < n1, k < n2:
    out.flat[dst_offset + i*ds0 + j*ds1 + k*ds2] = inputs[src].flat[src_offset + i*ss0 + j*ss1 + k*ss2]

Code reads them through `Region.of` / `regions_of` and writes them with `Region.to_list`, never by position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

REGION_LEN = 12
Triple = tuple[int, int, int]


@dataclass(frozen=True, slots=True)
class Region:
    src: int  # which input of the raster
    src_offset: int  # in elements of the source's row-major layout
    src_strides: Triple
    dst_offset: int  # in elements of the output's row-major layout
    dst_strides: Triple
    size: Triple  # the copy's three loop counts, outermost first

    @staticmethod
    def of(values: Sequence[Any]) -> Region:
        """A region from its twelve stored integers; ValueError when there are not twelve."""
        if len(values) != REGION_LEN:
            raise ValueError(f"raster region needs {REGION_LEN} integers, got {list(values)}")
        v = [int(x) for x in values]
        return Region(v[0], v[1], (v[2], v[3], v[4]), v[5], (v[6], v[7], v[8]), (v[9], v[10], v[11]))

    def to_list(self) -> list[int]:
        """The twelve integers stored in node attrs and program files."""
        return [self.src, self.src_offset, *self.src_strides, self.dst_offset, *self.dst_strides, *self.size]

    @property
    def numel(self) -> int:
        """Elements copied."""
        n0, n1, n2 = self.size
        return n0 * n1 * n2

    def extent(self, side: str) -> tuple[int, int]:
        """(lowest, highest) flat element the region touches on `side` ("src" or "dst"); it must be non-empty."""
        off, strides = (self.src_offset, self.src_strides) if side == "src" else (self.dst_offset, self.dst_strides)
        lo = off + sum(min(0, s * (n - 1)) for s, n in zip(strides, self.size))
        hi = off + sum(max(0, s * (n - 1)) for s, n in zip(strides, self.size))
        return lo, hi

    def is_identity(self, numel: int) -> bool:
        """Copies source 0's `numel` elements whole and in order into an output of `numel` (a reshape)."""
        if self.src != 0 or self.src_offset or self.dst_offset or self.numel != numel or numel == 0:
            return False
        expected = 1
        for n, s, d in reversed(list(zip(self.size, self.src_strides, self.dst_strides))):
            if n != 1 and (s != expected or d != expected):
                return False
            expected *= n
        return True

    def views(self, src_flat: np.ndarray, dst_flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(destination, source) 3-D views over flat buffers: copying the second into the first is the region.

        ndarrays over the buffers rather than as_strided: bounds-checked, and far cheaper to make on
        memory-mapped constants. The source view is read-only so a binding can never write through it.
        """
        item = src_flat.itemsize
        src = np.ndarray(self.size, src_flat.dtype, buffer=src_flat, offset=self.src_offset * item,
                         strides=tuple(s * item for s in self.src_strides))
        src.flags.writeable = False
        dst = np.ndarray(self.size, dst_flat.dtype, buffer=dst_flat, offset=self.dst_offset * item,
                         strides=tuple(d * item for d in self.dst_strides))
        return dst, src

    def index_grids(self) -> tuple[np.ndarray, np.ndarray]:
        """(flat destination indices, flat source indices) of every copied element, as int64 arrays."""
        i = np.arange(self.size[0], dtype=np.int64)[:, None, None]
        j = np.arange(self.size[1], dtype=np.int64)[None, :, None]
        k = np.arange(self.size[2], dtype=np.int64)[None, None, :]
        (s0, s1, s2), (d0, d1, d2) = self.src_strides, self.dst_strides
        dst = (self.dst_offset + i * d0 + j * d1 + k * d2).reshape(-1)
        src = (self.src_offset + i * s0 + j * s1 + k * s2).reshape(-1)
        return dst, src


def regions_of(attrs: Mapping[str, Any]) -> list[Region]:
    """The regions of a raster node's attrs."""
    return [Region.of(r) for r in attrs.get("regions") or []]


def copied_elements(regions: Sequence[Region]) -> int:
    return sum(r.numel for r in regions)
