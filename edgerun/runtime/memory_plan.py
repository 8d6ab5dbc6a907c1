"""Memory planning: give every arena tensor a byte offset in ONE arena, reusing bytes across lifetimes.

The planner sees buffers: a value, or a group of values that alias the same bytes (a no-op reshape shares
its input's bytes), each with a size and an inclusive lifetime [first, last] in schedule steps. Two buffers
whose lifetimes overlap must not share a byte. As in ExecuTorch, a small suite of algorithms runs and the
smallest arena wins: greedy best-fit and greedy first-fit (both largest buffer first) and the naive plan
(every buffer its own bytes), which bounds the others from above.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

ALIGNMENT = 64  # cache-line aligned: every vector unit we target loads aligned at this granularity


@dataclass(frozen=True)
class TensorLifetime:
    """A buffer to place: `nbytes` live from step `first` to step `last`, both inclusive."""

    name: str
    nbytes: int
    first: int
    last: int


@dataclass(frozen=True)
class ArenaPlan:
    """Where each planned value lives. `aliases` maps a value to the buffer whose bytes it shares."""

    algorithm: str
    arena_bytes: int
    offsets: dict[str, int]  # buffer name -> byte offset
    buffers: dict[str, TensorLifetime]  # buffer name -> union lifetime of the values sharing it
    values: dict[str, TensorLifetime]  # every planned value (aliases included) -> its own lifetime
    aliases: dict[str, str]  # value -> buffer name, for values that are not buffers themselves
    lower_bound: int  # peak bytes of simultaneously live buffers: no plan can be smaller
    naive_bytes: int  # every buffer its own aligned bytes
    candidates: dict[str, int]  # algorithm -> arena bytes it reached (the suite stops once one is optimal)

    def buffer_of(self, value: str) -> str:
        return self.aliases.get(value, value)

    def offset_of(self, value: str) -> int:
        return self.offsets[self.buffer_of(value)]

    @property
    def ratio_to_lower_bound(self) -> float:
        return self.arena_bytes / self.lower_bound if self.lower_bound else 1.0


def align_up(n: int, alignment: int = ALIGNMENT) -> int:
    return -(-n // alignment) * alignment


def allocate_arena(nbytes: int) -> np.ndarray:
    """One uint8 buffer of `nbytes` whose first byte is ALIGNMENT-aligned."""
    raw = np.empty(nbytes + ALIGNMENT, np.uint8)
    skip = (-raw.ctypes.data) % ALIGNMENT
    return raw[skip:skip + nbytes]


def peak_live_bytes(buffers: Sequence[TensorLifetime]) -> int:
    """The most bytes alive at any one step: a lower bound on every arena, whatever the algorithm."""
    if not buffers:
        return 0
    lo = min(b.first for b in buffers)
    hi = max(b.last for b in buffers)
    delta = np.zeros(hi - lo + 2, dtype=np.int64)
    for b in buffers:
        delta[b.first - lo] += b.nbytes
        delta[b.last - lo + 1] -= b.nbytes
    return int(np.cumsum(delta).max())


Placement = dict[str, int]


def plan_naive(buffers: Sequence[TensorLifetime]) -> Placement:
    offsets: Placement = {}
    cursor = 0
    for b in buffers:
        offsets[b.name] = cursor
        cursor += align_up(b.nbytes)
    return offsets


def _greedy(buffers: Sequence[TensorLifetime], best_fit: bool) -> Placement:
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i].nbytes, buffers[i].first, buffers[i].name))
    n = len(buffers)
    # Placed buffers as parallel arrays, so the lifetime-overlap test is one vectorised comparison.
    first = np.empty(n, np.int64)
    last = np.empty(n, np.int64)
    start = np.empty(n, np.int64)
    end = np.empty(n, np.int64)
    placed = 0
    offsets: Placement = {}
    for i in order:
        b = buffers[i]
        if b.nbytes == 0:
            offsets[b.name] = 0
            continue
        live = (first[:placed] <= b.last) & (last[:placed] >= b.first)
        offset = 0
        if live.any():
            starts, ends = start[:placed][live], end[:placed][live]
            by_start = np.argsort(starts, kind="stable")
            starts, ends = starts[by_start], ends[by_start]
            # Gap k runs from the furthest end of blocks before k (aligned) to the start of block k; the last
            # gap is open-ended and always fits.
            gap_lo = np.concatenate(([0], np.maximum.accumulate(ends)))
            gap_lo = -(-gap_lo // ALIGNMENT) * ALIGNMENT
            gap_hi = np.concatenate((starts, [np.iinfo(np.int64).max]))
            room = gap_hi - gap_lo
            fits = np.flatnonzero(room >= b.nbytes)
            if best_fit and len(fits) > 1:
                k = int(fits[np.argmin(room[fits])])  # the tightest gap; the open end is never tighter
            else:
                k = int(fits[0])
            offset = int(gap_lo[k])
        offsets[b.name] = offset
        first[placed], last[placed], start[placed], end[placed] = b.first, b.last, offset, offset + b.nbytes
        placed += 1
    return offsets


ALGORITHMS: dict[str, Callable[[Sequence[TensorLifetime]], Placement]] = {
    # Largest first; each into the tightest gap among the buffers whose lifetimes overlap it.
    "greedy_best_fit": functools.partial(_greedy, best_fit=True),
    # Largest first; each at the lowest offset that is free for its whole lifetime.
    "greedy_first_fit": functools.partial(_greedy, best_fit=False),
    "naive": plan_naive,
}


def arena_size(buffers: Sequence[TensorLifetime], offsets: Mapping[str, int]) -> int:
    return align_up(max((offsets[b.name] + b.nbytes for b in buffers), default=0))


def union_lifetimes(values: Mapping[str, TensorLifetime], aliases: Mapping[str, str]) -> dict[str, TensorLifetime]:
    """One buffer per alias group, live from the first definition to the last read of any member."""
    spans: dict[str, tuple[int, int, int]] = {}
    for name, v in values.items():
        root = aliases.get(name, name)
        if root in spans:
            nbytes, lo, hi = spans[root]
            spans[root] = (max(nbytes, v.nbytes), min(lo, v.first), max(hi, v.last))
        else:
            spans[root] = (v.nbytes, v.first, v.last)
    return {root: TensorLifetime(root, n, lo, hi) for root, (n, lo, hi) in spans.items()}


def plan_memory(values: Mapping[str, TensorLifetime], aliases: Mapping[str, str] | None = None,
                algorithms: Sequence[str] | None = None) -> ArenaPlan:
    """Run the planner suite over `values` (aliases share their buffer's bytes) and keep the smallest arena."""
    aliases = dict(aliases or {})
    buffers = union_lifetimes(values, aliases)
    ordered = [buffers[k] for k in sorted(buffers)]
    naive_bytes = arena_size(ordered, plan_naive(ordered))
    lower_bound = peak_live_bytes(ordered)
    candidates: dict[str, int] = {}
    best_name, best, best_size = "", {}, -1
    for name in [*(algorithms or ALGORITHMS), "naive"]:
        if name in candidates:
            continue
        if best_size == align_up(lower_bound):
            break  # already optimal: every arena is at least the bound, rounded up to the alignment
        offsets = ALGORITHMS[name](ordered)
        size = arena_size(ordered, offsets)
        candidates[name] = size
        if best_size < 0 or size < best_size:  # ties keep the earlier (preferred) algorithm
            best_name, best, best_size = name, offsets, size
    return ArenaPlan(best_name, best_size, best, buffers, dict(values), aliases, lower_bound, naive_bytes,
                     candidates)
