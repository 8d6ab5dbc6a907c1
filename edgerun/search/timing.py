"""Timing candidate placements at first load so that the figures are what a user gets in steady state.

Several loaded candidates timed one after the other in one process mislead in two ways (both seen on
SqueezeNet, idle 2-core machine: a mix with the last conv on the reference measured 8.0 ms against 16.0 ms
for all on ONNX Runtime at first load, and ran 11-16 ms against 4.6 ms afterwards):

- a candidate's threads keep cores busy after its call returns: numpy's OpenBLAS threads spin for about
  0.1 s after a GEMM (ORT's SqueezeNet ran 6.0 ms instead of 4.6 for 110 ms after five 512x512 GEMMs), so
  the candidate timed next pays for the one timed before;
- a fresh session's first calls are slow (arena growth, cold caches, a pool whose threads went to sleep).

So the candidates are timed in interleaved rounds, in a rotated order. Each block opens with untimed calls
for as long as the previous candidate's backends keep their threads busy (`Backend.busy_after_call_s`),
at least one call; then BLOCK_CALLS timed calls, whose median is the block's figure. A candidate's time is
the smallest of its block medians: on a shared machine noise only adds, and warm-up only fades.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping

BLOCK_CALLS = 3  # timed calls per block; their median is the block's figure
MIN_ROUNDS = 3  # rounds every contender gets, the budget permitting (at least 2 in any case)
MAX_ROUNDS = 8  # while the budget lasts, unless one candidate leads by DECISIVE
DECISIVE = 1.3  # after the minimum rounds, a lead this large ends the timing (more rounds would not change it)


def steady_seconds(calls: Mapping[str, Callable[[], object]], busy_after_s: Mapping[str, float],
                   call_s: Mapping[str, float], deadline: float = math.inf) -> dict[str, float]:
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
    left = deadline - time.perf_counter()
    block = BLOCK_CALLS if round_s * MIN_ROUNDS <= left else 1
    min_rounds = MIN_ROUNDS if block == BLOCK_CALLS else 2
    previous = labels[-1]  # whatever ran last before the rounds: the warm-ups ran in order
    rounds = 0
    while rounds < min_rounds or (rounds < MAX_ROUNDS and time.perf_counter() + round_s < deadline
                                  and not _decided(best)):
        shift = rounds % len(labels)
        for label in labels[shift:] + labels[:shift]:
            call = calls[label]
            settle_until = time.perf_counter() + (busy_after_s.get(previous, 0.0) if previous != label else 0.0)
            call()
            while time.perf_counter() < settle_until:
                call()
            times = []
            for _ in range(block):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            best[label] = min(best[label], statistics.median(times))
            previous = label
        rounds += 1
    return best


def _decided(best: Mapping[str, float]) -> bool:
    first, second = sorted(best.values())[:2] if len(best) > 1 else (0.0, math.inf)
    return second >= DECISIVE * first
