"""Timing candidates at first load: the one place the search reads a clock.

Every function here takes the clock (`Clock`, seconds as a float; `time.perf_counter` by default), so the
search's decisions are tested exactly on a fake clock that the fake candidates advance.

Two figures are taken of a loaded candidate: its *warm-up*, the fastest of a few first calls (a fresh
session's first call can be many times its steady time), a call past the time that rules the candidate out
abandoned at the next instruction boundary; and, for the contenders left, its *steady* time, in interleaved
rounds, each block waiting out the threads the previous candidate left busy (numpy's BLAS pool spins for
about 0.1 s after a call, so the next candidate would pay for it). A candidate's time is the smallest of its
block medians: on a shared machine noise only adds, and warm-up only fades. docs/backends.md has the figures.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping
from typing import Any

Clock = Callable[[], float]  # seconds, monotonic

# Warm-up: the fastest of up to WARM_UP_CALLS calls made within WARM_UP_S (a model whose first call takes
# longer is called once).
WARM_UP_CALLS = 5
WARM_UP_S = 0.05

BLOCK_CALLS = 3  # timed calls per block; their median is the block's figure
MIN_ROUNDS = 3  # rounds every contender gets, the deadline permitting (at least 2 in any case)
MAX_ROUNDS = 8  # while time is left, unless one candidate leads by DECISIVE
DECISIVE = 1.3  # after the minimum rounds, a lead this large ends the timing (more rounds would not change it)

# A warm-up call is handed a sink called at each instruction boundary (runtime.instructions.EventSink).
Sink = Callable[[Any], None]


class _Overrun(Exception):
    """Raised from the sink: the warm-up call ran past the time that already rules it out."""


def warm_up_seconds(run: Callable[[Sink | None], object], limit_s: float = math.inf, *,
                    calls: int = WARM_UP_CALLS, within_s: float = WARM_UP_S,
                    clock: Clock = time.perf_counter) -> float:
    """The fastest of up to `calls` timed calls of `run(sink)`, the first always made, the others while
    `within_s` lasts; math.inf when a call ran past `limit_s`, abandoned at the next instruction boundary."""
    sink: Sink | None = None
    t0 = 0.0
    if math.isfinite(limit_s):
        def sink(event: object) -> None:
            if clock() - t0 > limit_s:
                raise _Overrun
    start = clock()
    best = math.inf
    for _ in range(max(calls, 1)):
        t0 = clock()
        try:
            run(sink)
        except _Overrun:
            return math.inf
        t1 = clock()
        best = min(best, t1 - t0)
        if t1 - start >= within_s:
            break
    return best


def steady_seconds(calls: Mapping[str, Callable[[], object]], busy_after_s: Mapping[str, float],
                   call_s: Mapping[str, float], deadline: float = math.inf, *,
                   clock: Clock = time.perf_counter) -> dict[str, float]:
    """Per label, seconds of one call in steady state: the smallest of its per-round block medians.

    `calls`: label -> a call of that candidate; `busy_after_s`: label -> how long its threads stay busy after
    a call (the next block's untimed lead-in); `call_s`: label -> a first estimate of one call (its
    warm-up), used to fit the rounds into the time left before `deadline`. At least two rounds of at least
    one timed call each are always run; MIN_ROUNDS of BLOCK_CALLS when they fit, more up to MAX_ROUNDS while
    time is left and no candidate leads the others by DECISIVE.
    """
    labels = list(calls)
    best = dict.fromkeys(labels, math.inf)
    if not labels:
        return best
    round_s = sum(busy_after_s.get(lb, 0.0) + (1 + BLOCK_CALLS) * call_s.get(lb, 0.0) for lb in labels)
    block = BLOCK_CALLS if round_s * MIN_ROUNDS <= deadline - clock() else 1
    min_rounds = MIN_ROUNDS if block == BLOCK_CALLS else 2
    previous = labels[-1]  # whatever ran last before the rounds: the warm-ups ran in order
    rounds = 0
    while rounds < min_rounds or (rounds < MAX_ROUNDS and clock() + round_s < deadline and not _decided(best)):
        shift = rounds % len(labels)
        for label in labels[shift:] + labels[:shift]:
            call = calls[label]
            settle_until = clock() + (busy_after_s.get(previous, 0.0) if previous != label else 0.0)
            call()
            while clock() < settle_until:
                call()
            times = []
            for _ in range(block):
                start = clock()
                call()
                times.append(clock() - start)
            best[label] = min(best[label], statistics.median(times))
            previous = label
        rounds += 1
    return best


def _decided(best: Mapping[str, float]) -> bool:
    first, second = sorted(best.values())[:2] if len(best) > 1 else (0.0, math.inf)
    return second >= DECISIVE * first
