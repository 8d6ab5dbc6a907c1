"""Tuning: measure the best few candidate placements on this device and remember the winner.

Every `backends="auto"` load does this, bounded (FIRST_LOAD_BUDGET_S), when no winner is cached yet: the
cost model alone was seen 4.6x off on a busy machine (it put most of an MLP on the reference), and a
measured choice among the model's best few candidates, which include every backend alone, cannot be worse
than the best single-engine placement it measured. Once the budget is spent, a single engine the model
ranks slower than its optimum is left out (one warm-up call of the reference alone on an OCR detector took
7 s), and so is any candidate modelled MODELLED_CUTOFF times slower; when the optimum itself runs on one
engine, other single engines are measured only within SINGLE_SLACK of it, or within CHEAP_SINGLE_SLACK
while the budget lasts. The single engine cheapest to
build among those modelled within CHEAP_SINGLE_SLACK of the optimum is measured whatever those rules say,
first, and the rest are built cheapest first, so a mis-modelled dear engine (MNN's conversion: 1-4 s) can
neither hide nor starve it. Under a mixed optimum that single engine is the net, built whatever the
budget says; when it measures more than CHEAP_SINGLE_SLACK times its modelled time, the next such engine
becomes the net. An optimum on one engine is its own net, handed over the same way. `tune=True`
measures without the bound.

Candidates are the cost model's optimum, the same search with a costlier partition (fewer, larger
partitions), and each backend on its own (with reference taking what it cannot run), ordered by modelled
latency (and built in measuring_order's). Each is loaded and timed on synthetic inputs (zeros for integers, which are always valid indices;
normal noise for floats). The winner is cached under (device fingerprint, program hash), so the next load
of the same program on the same machine skips the measurement.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.ir.graph import Graph
from edgerun.runtime import LoadedProgram
from edgerun.runtime.instructions import EventSink, InstructionEvent
from edgerun.runtime.loader import load_prepared
from edgerun.search.cost_model import CostTable
from edgerun.search.fingerprint import cache_dir, device_fingerprint, read_json, write_json
from edgerun.search.placement_search import SearchResult, search_placement
from edgerun.search.timing import steady_seconds

DEFAULT_CANDIDATES = 3
# The measuring a plain auto load may spend, once per (device, program): loading and timing candidates.
FIRST_LOAD_BUDGET_S = 2.0


def tuned_path(program_hash: str, fingerprint: str | None = None) -> Path:
    return cache_dir() / "tuned" / (fingerprint or device_fingerprint()) / f"{program_hash}.json"


def cached_placement(graph: Graph, program_hash: str) -> dict[str, str] | None:
    """The tuned winner for this program on this machine, if one is cached and still fits the graph."""
    data = read_json(tuned_path(program_hash))
    if not isinstance(data, dict) or not isinstance(data.get("placement"), dict):
        return None
    placement = {str(k): str(v) for k, v in data["placement"].items()}
    return placement if set(placement) == {n.name for n in graph.nodes} else None


def candidate_placements(graph: Graph, table: CostTable, best: SearchResult,
                         count: int = DEFAULT_CANDIDATES) -> list[tuple[str, dict[str, str], float]]:
    """(label, placement, modelled seconds) of the distinct candidates, in the order they are measured:
    the model's optimum, then every backend alone (cheapest modelled first: the search must never lose to
    one of them), then the optimum with costlier partitions; at least `count`, and every single backend."""
    names = [n.name for n in graph.nodes]
    singles: list[tuple[str, list[str], float]] = []
    for b, backend in enumerate(table.backends):
        per_node = [backend if np.isfinite(table.seconds[k, b]) else "reference" for k in range(len(names))]
        cost = float(sum(table.seconds[k, table.backends.index(x)] for k, x in enumerate(per_node)))
        singles.append((f"all {backend}", per_node, cost))
    fewer = search_placement(table, partition_scale=8.0)
    found = [("search", best.backend_of, best.seconds), *sorted(singles, key=lambda c: c[2]),
             ("search, fewer partitions", fewer.backend_of, fewer.seconds)]
    unique: dict[tuple[str, ...], tuple[str, list[str], float]] = {}
    for label, per_node, cost in found:
        unique.setdefault(tuple(per_node), (label, per_node, cost))
    chosen = list(unique.values())[:max(count, 1 + len(singles))]
    return [(label, dict(zip(names, per_node)), cost) for label, per_node, cost in chosen]


CandidateLoader = Callable[[Mapping[str, str]], LoadedProgram]


# A candidate whose warm-up call is this much slower than the best warm-up is out. Not less: a fresh
# session's first call, or one right after another candidate's, was seen 3x its steady time.
CONTENDER_FACTOR = 3.0
# A placement over several backends must measure this much faster than one over fewer to win: a few calls
# on a busy machine cannot resolve less, and mixing costs what a short measurement may miss (threads of the
# backend left behind spinning while the next one works).
MIXED_MARGIN = 1.05
# A candidate modelled this many times slower than the optimum is not even loaded (the model's estimates were
# seen 0.23x to 4.1x off; running the reference alone on an OCR detector once costs seconds of load time).
MODELLED_CUTOFF = 10.0
# When the optimum already runs on one engine, another single engine is measured only if the model ranks it
# within this factor of the optimum: the model put the reference 1.3-3x behind ORT on real OCR, audio and
# detection models where it measured 8-13x behind, after 2-5 s of first load spent running it once.
SINGLE_SLACK = 1.25
# Of the single engines modelled within CHEAP_SINGLE_SLACK of the optimum, the cheapest to build (by
# calibration's estimate) is always measured, first, when its estimate fits the budget: with MNN's memory
# rate corrected the model put ResNet-18 at 26-28 ms on MNN and 41-55 on ORT (load 7-12), where at idle the
# two ran within 5% and ORT sometimes ahead, so ORT fell outside SINGLE_SLACK, or MNN's conversions (1-4 s)
# spent the budget before ORT's session (0.3-0.4 s; estimated 0.6 s at load 7) was reached.
CHEAP_SINGLE_SLACK = 2.0


# A candidate's warm-up is its fastest of up to WARM_UP_CALLS calls made within WARM_UP_S: a fresh ORT
# session's first call on DIN took 8.4 ms against 0.06 ms in steady state (load 5), which put it beyond
# CONTENDER_FACTOR of the reference's 0.37 ms and left DIN on the reference at 2.4x ORT's time. A model
# whose first call takes longer than WARM_UP_S is called once, as before.
WARM_UP_CALLS = 5
WARM_UP_S = 0.05
# A warm-up call is abandoned mid-call only once it is past CONTENDER_FACTOR x the best warm-up *and* this
# long: a fresh ORT session's first call on DIN (8 ms against 0.06 ms steady) was abandoned against the
# reference's 0.14 ms, so ORT was never measured and DIN ran on the reference at 2.8x ORT's time
# (bench/peers.py, idle). Past 50 ms a first call still loses what it would cost: SqueezeNet's reference
# alone took 2.1 s for its one call.
ABANDON_FLOOR_S = WARM_UP_S


class _Overrun(Exception):
    """Raised from the profiling sink: the warm-up call ran past the time that already rules it out."""


def warm_up_seconds(run: Callable[[EventSink | None], object], limit_s: float = math.inf,
                    calls: int = WARM_UP_CALLS, within_s: float = WARM_UP_S) -> float:
    """The fastest of up to `calls` timed calls of `run(sink)`, the first always made, the others while
    `within_s` lasts; math.inf when a call ran past `limit_s`, abandoned at the next instruction boundary.

    The limit is what keeps a misjudged candidate from eating the load: the model ranked the reference alone
    1.4x behind SqueezeNet's optimum, and its one warm-up call took 2.1 s at load 8 (all-ORT: 60 ms), where
    3x the best warm-up so far (CONTENDER_FACTOR) already culls it.
    """
    sink: EventSink | None = None
    t0 = 0.0
    if math.isfinite(limit_s):
        def sink(event: InstructionEvent) -> None:
            if time.perf_counter() - t0 > limit_s:
                raise _Overrun
    start = time.perf_counter()
    best = math.inf
    for _ in range(max(calls, 1)):
        t0 = time.perf_counter()
        try:
            run(sink)
        except _Overrun:
            return math.inf
        t1 = time.perf_counter()
        best = min(best, t1 - t0)
        if t1 - start >= within_s:
            break
    return best


# Calibration's build figures come from small graphs and run low on big ones: ResNet-50 on MNN was estimated
# at 1.6 s and converted in 4.0 s (load 4.5; ORT's session built in 0.2 s against 0.5), which took its first auto load
# to 3.1-3.6 s for a candidate that lost. A build counts this many times its estimate against the budget.
BUILD_MARGIN = 2.0


def load_candidate(graph: Graph, placement: Mapping[str, str], loader: CandidateLoader | None) -> LoadedProgram:
    # The graph is the one the search placed (prepared for its candidates): hand it to the runtime as it is.
    return loader(placement) if loader is not None else \
        load_prepared(None, graph, graph, sorted(set(placement.values())), placement=placement)


def busy_after_call_s(loaded: LoadedProgram) -> float:
    """How long the threads of the backends `loaded` runs on stay busy after a call (Backend's declaration)."""
    backends = loaded.parts.backends
    return max((backends[p.backend].busy_after_call_s for p in loaded.partitions if p.backend in backends),
               default=0.0)


def synthetic_inputs(graph: Graph) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = []
    for name in graph.inputs:
        spec = graph.specs[name]
        if spec.dtype.is_float:
            arrays.append(rng.standard_normal(spec.shape).astype(spec.dtype.np))
        else:
            arrays.append(np.zeros(spec.shape, spec.dtype.np))
    return arrays


def measuring_order(builds: Sequence[float], first: int | None) -> list[int]:
    """Indices into the candidates (model order) in the order pass 1 builds them: the cheap single engine
    that is always measured (`first`), the optimum (its warm-up sets the cut the others are abandoned at),
    then the rest cheapest build first, so a dear conversion cannot spend the budget a cheaper one needed."""
    head = [k for k in (first, 0) if k is not None]
    return list(dict.fromkeys(head)) + sorted((k for k in range(len(builds)) if k not in head),
                                              key=lambda k: builds[k])


def _cheap_single(candidates: Sequence[tuple[str, Mapping[str, str], float]], builds: Sequence[float],
                  budget_s: float) -> int | None:
    """The single engine always measured: of those modelled within CHEAP_SINGLE_SLACK of the optimum, the
    cheapest to build, if its estimated build fits the budget and it is not the optimum itself."""
    close = [k for k, (label, placement, modelled) in enumerate(candidates)
             if (label.startswith("all ") or (not k and len(set(placement.values())) == 1))
             and modelled <= CHEAP_SINGLE_SLACK * candidates[0][2]]
    if not close:
        return None
    k = min(close, key=lambda k: builds[k])
    return k if k and builds[k] <= budget_s else None


def _next_net(candidates: Sequence[tuple[str, Mapping[str, str], float]], builds: Sequence[float],
              tried: set[int]) -> int | None:
    """The next net under a mixed optimum once the cheap single engine measured far slower than its model:
    of the single engines modelled within CHEAP_SINGLE_SLACK of the optimum and not yet tried, the cheapest
    to build (built whatever the budget says, as the net is)."""
    close = [k for k, (label, _, modelled) in enumerate(candidates)
             if k and k not in tried and label.startswith("all ") and modelled <= CHEAP_SINGLE_SLACK * candidates[0][2]]
    return min(close, key=lambda k: builds[k], default=None)


def _safety_net(candidates: Sequence[tuple[str, Mapping[str, str], float]],
                build_estimate: Callable[[Mapping[str, str]], float] | None) -> int:
    """Under a mixed optimum, the single engine built whatever its build costs: of those modelled within
    SINGLE_SLACK of the best-modelled one, the cheapest to build. The best-modelled alone was MNN on ResNet-18
    (21.3 ms modelled against ORT's 21.7): the mix measured 234 ms, ORT was left out for its build, and the
    MNN-and-reference placement (30 ms) won and was cached, 1.3x ORT's 20 ms (bench/peers.py, idle)."""
    singles = [(k, c) for k, c in enumerate(candidates) if c[0].startswith("all ")]
    if not singles:
        return 0
    close = [(k, c) for k, c in singles if c[2] <= SINGLE_SLACK * singles[0][1][2]]
    if build_estimate is None:
        return close[0][0]
    return min(close, key=lambda kc: build_estimate(kc[1][1]))[0]


def tune_placement(graph: Graph, table: CostTable, best: SearchResult, program_hash: str,
                   count: int = DEFAULT_CANDIDATES, *, budget_s: float = math.inf,
                   loader: CandidateLoader | None = None,
                   build_estimate: Callable[[Mapping[str, str]], float] | None = None,
                   abandon_floor_s: float = ABANDON_FLOOR_S,
                   ) -> tuple[dict[str, str], dict[str, Any], LoadedProgram | None]:
    """The measured-fastest candidate placement, a report of every candidate, and the winner loaded (None
    when it came from the cache). Candidates are measured in measuring_order (candidate_placements' order
    when the load is unbounded or builds are not estimated); past `budget_s`
    no candidate beyond the optimum and the single engines is loaded, and a single engine only when the
    model ranks it no slower than the optimum, and no candidate but the optimum whose `build_estimate`
    (seconds to compile its partitions) would overrun the budget. The winner is cached when every candidate
    was measured or deliberately left out."""
    cached = cached_placement(graph, program_hash)
    if cached is not None:
        return cached, {"source": "cache"}, None
    start = time.perf_counter()
    deadline = start + budget_s
    candidates = candidate_placements(graph, table, best, count)
    singles = sum(1 for label, _, _ in candidates if label.startswith("all "))
    inputs = synthetic_inputs(graph)
    # Pass 1: load each candidate and time its warm-up (warm_up_seconds). The optimum and the single-engine
    # placements always (auto must not lose to one of them); the budget bounds the rest. Clear losers are
    # freed at once; on a bounded load a warm-up already past the cut is abandoned mid-call.
    warm: list[tuple[float, str, dict[str, str], float, LoadedProgram | None]] = []
    hopeless: list[tuple[str, float, str]] = []  # (label, modelled, why it was not loaded)
    abandoned: list[tuple[str, float, str]] = []  # (label, modelled, why): loaded, warm-up cut short
    optimum_is_single = len(set(candidates[0][1].values())) == 1
    bounded = math.isfinite(budget_s) and build_estimate is not None
    builds = [build_estimate(p) if build_estimate is not None else 0.0 for _, p, _ in candidates]
    # Measured whatever the budget and the rules below say; it is also the net under a mixed optimum.
    always = _cheap_single(candidates, builds, budget_s) if bounded else None
    safety_net = 0 if optimum_is_single else always if always is not None else _safety_net(candidates, build_estimate)
    tried_nets: set[int] = set()
    for k in measuring_order(builds, always) if bounded else range(len(candidates)):
        label, placement, modelled = candidates[k]
        if k == always or (tried_nets and k == safety_net):
            pass  # the net: measured whatever the budget says
        elif k > singles and time.perf_counter() >= deadline:
            # A variant of the optimum, past the budget: left out on purpose, so the winner is still cached
            # (ResNet-50 at load 6 ran out before "fewer partitions" and measured everything again next load).
            hopeless.append((label, modelled, "budget spent before it was loaded"))
            continue
        elif k and modelled > MODELLED_CUTOFF * candidates[0][2]:
            hopeless.append((label, modelled, "modelled beyond the cutoff"))
            continue  # beyond any error the model was seen to make: loading and running it would only cost
        elif k and optimum_is_single and modelled > SINGLE_SLACK * candidates[0][2] \
                and (modelled > CHEAP_SINGLE_SLACK * candidates[0][2] or time.perf_counter() >= deadline):
            # Single engines are measured against the model misjudging a mix; an optimum on one engine
            # already is that safety net (the reference alone on an OCR detector: 3.5 s for one call). One
            # modelled within CHEAP_SINGLE_SLACK is still measured while the budget lasts (a warm-up past 3x
            # the best is abandoned): MNN alone on llama_small was modelled 2.35 ms, ORT 3.08, and MNN's
            # 2.62 ms was cached against ORT's 2.07 (bench/peers.py, idle).
            hopeless.append((label, modelled, "the optimum is one engine; modelled slower than it"))
            continue
        elif k and k != safety_net and build_estimate is not None \
                and time.perf_counter() + BUILD_MARGIN * builds[k] > deadline:
            # Building it alone would overrun the budget (MNN converts a large model in seconds); the
            # optimum and the best single engine, the net under a mix the model misjudged, are built anyway.
            hopeless.append((label, modelled, "its build would overrun the budget"))
            continue
        elif k and modelled >= candidates[0][2] and time.perf_counter() >= deadline:
            # The model says it loses and the budget is spent: on an OCR detector one warm-up call of the
            # reference alone took 7 s of a 15 s load.
            hopeless.append((label, modelled, "budget spent, modelled slower than the optimum"))
            continue
        loaded = load_candidate(graph, placement, loader)
        # Bounded loads only: tune=True measures every candidate in full, for the report.
        limit = max(CONTENDER_FACTOR * min((w[0] for w in warm), default=math.inf), abandon_floor_s) \
            if math.isfinite(budget_s) else math.inf
        first = warm_up_seconds(functools.partial(loaded.run, inputs), limit)
        if bounded and k == safety_net and first > CHEAP_SINGLE_SLACK * modelled:
            # The net itself is misjudged (the reference alone on MiniLM: modelled 8.5 ms next to a mix's
            # 8.2, measured 30.8; ORT and MNN were then left out for their builds and a 19 ms mix was cached
            # against ORT's 8 ms), or the optimum on one engine is (MNN alone on MobileNetV2: modelled 4.8 ms,
            # measured 10.7; ORT, modelled 6.8 and so outside SINGLE_SLACK, was never timed: 1.71x ORT in
            # bench/peers.py): the next close single engine becomes the net and is built anyway.
            tried_nets.add(k)
            safety_net = _next_net(candidates, builds, tried_nets) or safety_net
        if not math.isfinite(first):  # abandoned mid-call: slower than the cut already
            abandoned.append((label, modelled, f"warm-up call abandoned after {limit * 1e3:.1f} ms"))
            del loaded
            continue
        warm.append((first, label, placement, modelled, loaded))
        cut = CONTENDER_FACTOR * min(w[0] for w in warm)
        warm = [w if w[0] <= cut else (*w[:4], None) for w in warm]
    # Pass 2: the contenders timed as they will run, in interleaved rounds (timing.py); a candidate
    # culled after its warm-up keeps its warm-up time. One contender left wins whatever it measures.
    kept = {label: loaded for _, label, _, _, loaded in warm if loaded is not None}
    steady: dict[str, float] = {}
    if len(kept) > 1:
        steady = steady_seconds({label: functools.partial(loaded.run, inputs) for label, loaded in kept.items()},
                                {label: busy_after_call_s(loaded) for label, loaded in kept.items()},
                                {w[1]: w[0] for w in warm}, deadline)
    measured = [(steady.get(label, first), label, placement, modelled) for first, label, placement, modelled, _
                in warm]
    loaded_by_label = kept
    winner = min(measured, key=lambda m: m[0] * MIXED_MARGIN ** (len(set(m[2].values())) - 1))
    left_out = hopeless + abandoned
    complete = len(measured) + len(left_out) == len(candidates)
    considered = {lb for _, lb, _, _ in measured} | {lb for lb, _, _ in left_out}
    report = {"source": "measured", "winner": winner[1], "complete": complete,
              "spent_s": time.perf_counter() - start, "budget_s": budget_s,
              "candidates": [{"label": lb, "measured_s": s, "modelled_s": m, "backends": len(set(p.values()))}
                             for s, lb, p, m in measured]
              + [{"label": lb, "measured_s": None, "modelled_s": m, "skipped": why} for lb, m, why in left_out]
              + [{"label": lb, "measured_s": None, "modelled_s": m} for lb, _, m in candidates
                 if lb not in considered]}
    if complete:
        write_json(tuned_path(program_hash), {"placement": winner[2], **report})
    chosen = loaded_by_label.get(winner[1])
    if chosen is not None and steady:
        # The rounds may have ended on another contender whose threads still spin (the reference's BLAS
        # pool: 0.12 s); the winner runs until they are done, so the caller's first calls are not slowed
        # by the measurement (a tiny model's first 20 calls take a millisecond).
        settle_until = time.perf_counter() + max((busy_after_call_s(other) for label, other in kept.items()
                                                  if label != winner[1]), default=0.0)
        while time.perf_counter() < settle_until:
            chosen.run(inputs)
    return winner[2], report, chosen
