"""Index maps of raster nodes, and fitting strided regions back onto a map.

A raster's *index map* says, for every output element, which source it reads (-1: none, the fill) and at
which flat index. Composing two rasters is composing their maps with numpy; the composed map is then cut
into cells that each read one source through an affine pattern, and each cell becomes regions again.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

from edgerun.ir.ops.raster import StoredRegion, strided_copy_regions
from edgerun.ir.region import Region
from edgerun.ir.tensor_spec import contiguous_strides

# Index maps are int64 arrays of the output's size; past this many elements merging is not worth the memory.
MAX_MAP_ELEMENTS = 1 << 21
_MAX_VIEWS = 4


def raster_index_map(regions: Sequence[Sequence[int]], numel: int) -> tuple[np.ndarray, np.ndarray]:
    """(source id, flat source index) of every output element; id -1 marks elements no region writes."""
    sid = np.full(numel, -1, dtype=np.int64)
    idx = np.zeros(numel, dtype=np.int64)
    for r in map(Region.of, regions):
        if r.numel == 0:
            continue
        dst, src = r.index_grids()
        # Later regions overwrite earlier ones, exactly as the kernel applies them in order.
        sid[dst] = r.src
        idx[dst] = src
    return sid, idx


def _factor_profile(profile: np.ndarray) -> list[tuple[int, int]] | None:
    """Nested loops (size, stride), outermost first, that generate a 1-D index profile starting at 0.

    A merged output axis (reshape after transpose) is affine only in its factors: [0, 3, 1, 4, 2, 5] is
    (3, stride 1) outside (2, stride 3). None when the profile is not such a nest.
    """
    dims: list[tuple[int, int]] = []
    f = profile
    while len(f) > 1:
        n = len(f)
        step = int(f[1] - f[0])
        ok = f == f[0] + step * np.arange(n, dtype=np.int64)
        run = n if bool(ok.all()) else int(np.argmin(ok))
        if n % run:
            return None
        rows = f.reshape(n // run, run)
        if not bool((rows == rows[:, :1] + step * np.arange(run, dtype=np.int64)).all()):
            return None
        dims.append((run, step))
        f = rows[:, 0]
    return dims[::-1]


def _fit_affine_cell(src: int, idx: np.ndarray, dst_offset: int, out_strides: Sequence[int]) -> list[StoredRegion] | None:
    """Regions for a block that reads one source, when its index map is a sum of per-axis nests.

    `out_strides` are the output strides of the block's axes, so a block may be a strided lattice too.
    """
    origin = int(idx.flat[0])
    sizes: list[int] = []
    src_strides: list[int] = []
    dst_strides: list[int] = []
    expected = np.full(idx.shape, origin, dtype=np.int64)
    for axis, n in enumerate(idx.shape):
        at = tuple(slice(None) if a == axis else 0 for a in range(idx.ndim))
        profile = idx[at] - origin
        nest = _factor_profile(profile)
        if nest is None:
            return None
        inner = 1
        factored: list[tuple[int, int, int]] = []
        for size, stride in reversed(nest):
            factored.append((size, stride, out_strides[axis] * inner))
            inner *= size
        for size, stride, dst in reversed(factored):
            sizes.append(size)
            src_strides.append(stride)
            dst_strides.append(dst)
        shape = [1] * idx.ndim
        shape[axis] = n
        expected = expected + profile.reshape(shape)
    if not np.array_equal(expected, idx):
        return None
    return strided_copy_regions(src, origin, src_strides, dst_offset, dst_strides, sizes)


def _segments(boundaries: Sequence[int], n: int) -> list[tuple[int, int]]:
    edges = [0, *boundaries, n]
    return [(a, b) for a, b in itertools.pairwise(edges) if b > a]


def _source_cells(sid: np.ndarray) -> list[list[tuple[int, int]]]:
    """Per axis, the segments between positions where the source id changes anywhere in the slab."""
    per_axis = []
    for axis in range(sid.ndim):
        other = tuple(a for a in range(sid.ndim) if a != axis)
        change = (np.diff(sid, axis=axis) != 0).any(axis=other) if other else np.diff(sid) != 0
        per_axis.append(_segments([int(p) + 1 for p in np.nonzero(change)[0]], sid.shape[axis]))
    return per_axis


def _progression(positions: np.ndarray) -> tuple[int, int, int] | None:
    """(start, step, count) when `positions` are evenly spaced."""
    if len(positions) == 1:
        return int(positions[0]), 1, 1
    steps = np.diff(positions)
    if not bool((steps == steps[0]).all()):
        return None
    return int(positions[0]), int(steps[0]), len(positions)


def _lattices(sid: np.ndarray) -> dict[int, list[tuple[int, int, int]]] | None:
    """Per source, the evenly spaced positions along each axis whose product is exactly where it is read.

    Concats are blocks (step 1); interleaves such as a channel shuffle are lattices with a larger step.
    """
    found = {}
    present = np.bincount(sid.reshape(-1) + 1)[1:]  # ids are -1 (fill) and a few sources: no sort needed
    for src in (int(v) for v in np.flatnonzero(present)):
        mask = sid == src
        progressions = []
        for axis in range(sid.ndim):
            other = tuple(a for a in range(sid.ndim) if a != axis)
            progression = _progression(np.nonzero(mask.any(axis=other) if other else mask)[0])
            if progression is None:
                return None
            progressions.append(progression)
        if int(mask.sum()) != int(np.prod([n for _, _, n in progressions])):
            return None  # the projections are lattices but the set is not their product
        found[src] = progressions
    return found


def _step_segments(idx: np.ndarray, axis: int, limit: int) -> list[tuple[int, int]] | None:
    """Greedy runs along `axis` in which the step between neighbouring slabs stays the same.

    None past `limit` runs. Within a run every step equals the run's first, so a run ends where a step differs
    from the one before it: one vectorised comparison of neighbouring steps, then a walk over booleans.
    """
    n = idx.shape[axis]
    if n < 3:
        return [(0, n)]
    steps = np.moveaxis(np.diff(idx, axis=axis), axis, 0).reshape(n - 1, -1)
    changed = (steps[1:] != steps[:-1]).any(axis=1)  # changed[q - 1]: step q differs from step q - 1
    boundaries: list[int] = []
    start = 0
    for q in (int(q) + 1 for q in np.nonzero(changed)[0]):
        p = q + 1  # step q lies between slabs q and q + 1: the run before it ends at slab q
        if p > start + 1 and p < n:
            boundaries.append(p)
            start = p
            if len(boundaries) >= limit:
                return None
    return _segments(boundaries, n)


class _Fitter:
    def __init__(self, sid: np.ndarray, idx: np.ndarray, budget: int) -> None:
        self.sid, self.idx, self.budget = sid, idx, budget
        self.out_strides = contiguous_strides(tuple(sid.shape))
        self.regions: list[StoredRegion] = []

    def _offset(self, lo: Sequence[int]) -> int:
        return sum(int(a) * int(s) for a, s in zip(lo, self.out_strides))

    def _fit_lattices(self, sid: np.ndarray, lo: tuple[int, ...]) -> bool:
        """Fit each source of a mixed block as one strided lattice; False (adding nothing) when one is not."""
        lattices = _lattices(sid)
        if lattices is None:
            return False
        found: list[StoredRegion] = []
        for src, progressions in lattices.items():
            at = np.ix_(*[a + start + step * np.arange(n) for a, (start, step, n) in zip(lo, progressions)])
            strides = [s * step for s, (_, step, _) in zip(self.out_strides, progressions)]
            offset = self._offset([a + start for a, (start, _, _) in zip(lo, progressions)])
            regions = _fit_affine_cell(src, self.idx[at], offset, strides)
            if regions is None:
                return False
            found += regions
        self.regions += found
        return True

    def fit(self, lo: tuple[int, ...], hi: tuple[int, ...]) -> bool:
        window = tuple(slice(a, b) for a, b in zip(lo, hi))
        sid = self.sid[window]
        first = int(sid.flat[0])
        if bool((sid == first).all()):
            if first < 0:
                return True
            idx = self.idx[window]
            found = _fit_affine_cell(first, idx, self._offset(lo), self.out_strides)
            if found is not None:
                self.regions += found
                return len(self.regions) <= self.budget
            limit = self.budget - len(self.regions) + 1
            splits = [(len(s), a, s) for a, s in enumerate(_step_segments(idx, a, limit) for a in range(idx.ndim))
                      if s is not None and len(s) > 1]
            if not splits:
                return False
            _, axis, segments = min(splits)
            per_axis = [[(0, n)] for n in idx.shape]
            per_axis[axis] = segments
        else:
            if self._fit_lattices(sid, lo):
                return len(self.regions) <= self.budget
            per_axis = _source_cells(sid)
            if self._fit_slabs(lo, per_axis):
                return True
        return self._fit_cells(lo, per_axis)

    def _fit_cells(self, lo: tuple[int, ...], per_axis: list[list[tuple[int, int]]]) -> bool:
        cells = list(itertools.product(*per_axis))
        if len(cells) > 4 * self.budget + 16:
            return False
        for cell in cells:
            if not self.fit(tuple(a + c for a, (c, _) in zip(lo, cell)),
                            tuple(a + d for a, (_, d) in zip(lo, cell))):
                return False
        return True

    def _fit_slabs(self, lo: tuple[int, ...], per_axis: list[list[tuple[int, int]]]) -> bool:
        """Cut a mixed block along the one axis where its source changes most often, each slab fitted on its
        own; False (adding nothing) when that does not fit. Cutting along every axis at once splits every
        source at every boundary: a concat of shifted pads (a pitch tracker's harmonic stacking, 8 channels
        each a source with a fill band of its own) is 8 slabs of one region each, but 15 cells."""
        cut = [a for a, segments in enumerate(per_axis) if len(segments) > 1]
        if len(cut) < 2:
            return False  # a cut along one axis is what the cells are already
        axis = max(cut, key=lambda a: len(per_axis[a]))
        slabs = [[(0, n)] if a != axis else segments for a, (segments, n) in
                 enumerate(zip(per_axis, (segs[-1][1] for segs in per_axis)))]
        mark = len(self.regions)
        if self._fit_cells(lo, slabs) and len(self.regions) <= self.budget:
            return True
        del self.regions[mark:]
        return False


def _periodic_view(sid: np.ndarray) -> tuple[int, ...] | None:
    """The output shape with each axis whose source ids repeat with a period p split into (n/p, p).

    A channel shuffle interleaves two sources channel by channel; on the split axis each source is one
    strided region instead of one region per channel.
    """
    shape: list[int] = []
    for axis, n in enumerate(sid.shape):
        moved = np.moveaxis(sid, axis, 0)
        period = next((p for p in range(2, n // 2 + 1) if n % p == 0 and np.array_equal(moved[p:], moved[:-p])),
                      None)
        shape += [n // period, period] if period else [n]
    return tuple(shape) if len(shape) > sid.ndim else None


def fit_regions(sid: np.ndarray, idx: np.ndarray, budget: int) -> list[StoredRegion] | None:
    """Regions that reproduce the map (`sid`, `idx` shaped like the output), or None past `budget` regions."""
    if sid.size == 0:
        return []
    if sid.ndim == 0:
        sid, idx = sid.reshape(1), idx.reshape(1)
    shape: tuple[int, ...] | None = tuple(sid.shape)
    for _ in range(_MAX_VIEWS):
        if shape is None:
            break
        # A row-major reshape of the output leaves flat destinations unchanged, so any view may be fitted.
        view = sid.reshape(shape)
        fitter = _Fitter(view, idx.reshape(shape), budget)
        if fitter.fit((0,) * len(shape), shape):
            return fitter.regions
        shape = _periodic_view(view)  # interleaves of interleaves (shuffle after shuffle) split again
    return None
