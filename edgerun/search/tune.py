"""Tuning: measure the best few candidate placements on this device and remember the winner.

Every `backends="auto"` load does this, bounded (FIRST_LOAD_BUDGET_S), when no winner is cached yet: the
cost model alone can be several times off (on a busy machine above all), and a measured choice among the
model's best few candidates, which include every backend alone, cannot be worse than the best
single-engine placement it measured. `tune=True` measures without the bound.

The search is data (docs/backends.md has each figure and rule): candidates, `Margins`, rules (`LEAVE_OUT`),
with the clock and the loader injected, so the tests check its decisions exactly on a fake clock. The *net*
is the single engine measured whatever the budget says (`cheap_single`, `safety_net`, `next_net`), so a
mixed optimum the model misjudged cannot win by default.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import numpy as np

from edgerun.heap import return_freed_memory
from edgerun.ir.graph import Graph
from edgerun.search import machine_load
from edgerun.search.cost_model import CostTable
from edgerun.search.fingerprint import cache_dir, device_fingerprint, read_json, write_json
from edgerun.search.machine_load import BusyProbe, worth_retaking
from edgerun.search.placement_search import SearchResult, search_placement
from edgerun.search.timing import Clock, Sink, steady_seconds, warm_up_seconds

DEFAULT_CANDIDATES = 3
# The measuring a plain auto load may spend, once per (device, program): loading and timing candidates.
FIRST_LOAD_BUDGET_S = 2.0
# The cost of a partition in the "fewer partitions" candidate, as a multiple of the calibrated one.
FEWER_PARTITIONS_SCALE = 8.0


@dataclass(frozen=True)
class Margins:
    """The factors the search decides by; each is a ratio of times unless its name ends in _s."""

    # A candidate whose warm-up is this many times the best warm-up so far is out (a fresh session's first
    # call, or one right after another candidate's, can be this far above its steady time).
    contender_factor: float = 3.0
    # A placement over more backends must measure this much faster per extra backend to win: a few calls
    # cannot resolve less, and mixing costs what a short measurement may miss (threads left spinning).
    mixed_margin: float = 1.05
    # A candidate modelled this many times slower than the optimum is never loaded: beyond the model's error.
    modelled_cutoff: float = 10.0
    # Under an optimum on one engine, another single engine is measured only within this factor of it...
    single_slack: float = 1.25
    # ...or within this one while the budget lasts. It also bounds the net: a single engine modelled
    # within it is the net's candidate, and a net measuring more than this times its model hands over.
    cheap_single_slack: float = 2.0
    # An estimated build counts this many times against the budget (calibration's build figures come from
    # small graphs and run low on large ones).
    build_margin: float = 2.0
    # A warm-up call is abandoned mid-call only once past the contender cut *and* this long: a fresh
    # session's first call is granted this much, whatever the fastest warm-up so far.
    abandon_floor_s: float = 0.05


MARGINS = Margins()


class Candidate(NamedTuple):
    label: str  # "search", "all <backend>", "search, fewer partitions"
    placement: dict[str, str]  # node name -> backend
    modelled_s: float


class Trial(Protocol):
    """A loaded candidate, as the search sees it (a LoadedProgram; a fake in the tests)."""

    @property
    def busy_after_call_s(self) -> float: ...

    def run(self, inputs: list[np.ndarray], sink: Sink | None = None) -> object: ...

    def release(self) -> None: ...


def discard(trial: Trial) -> None:
    """A candidate that lost: its sessions and converted models freed now (RunnableProgram.release), and
    the freed heap given back, so the next candidate builds in that memory rather than beside it."""
    trial.release()
    return_freed_memory()


CandidateLoader = Callable[[Mapping[str, str]], Trial]


def tuned_path(program_hash: str, fingerprint: str | None = None) -> Path:
    """The one cache entry of a program on this device: its winner, the report, the tuned settings."""
    return cache_dir() / "tuned" / (fingerprint or device_fingerprint()) / f"{program_hash}.json"


def read_tuned(program_hash: str) -> dict[str, Any]:
    data = read_json(tuned_path(program_hash))
    return data if isinstance(data, dict) else {}


def update_tuned(program_hash: str, **entries: Any) -> None:
    write_json(tuned_path(program_hash), {**read_tuned(program_hash), **entries})


def cached_placement(graph: Graph, program_hash: str, busy: BusyProbe | None = None) -> dict[str, str] | None:
    """The tuned winner for this program on this machine, if one is cached and still fits the graph, and was
    not measured while the machine was busy with others if it is quiet now (machine_load.py: then the
    candidates are measured again). `busy` probes the machine (default: machine_load.other_cpu_busy)."""
    entry = read_tuned(program_hash)
    data = entry.get("placement")
    if not isinstance(data, dict) or worth_retaking(entry.get("busy"), busy or machine_load.other_cpu_busy):
        return None
    placement = {str(k): str(v) for k, v in data.items()}
    return placement if set(placement) == {n.name for n in graph.nodes} else None


def candidate_placements(graph: Graph, table: CostTable, best: SearchResult,
                         count: int = DEFAULT_CANDIDATES) -> list[Candidate]:
    """The distinct candidates in model order: the model's optimum, then every backend alone (cheapest
    modelled first: the search must never lose to one of them), then the optimum with costlier partitions;
    at least `count`, and every single backend."""
    names = [n.name for n in graph.nodes]
    singles: list[tuple[str, list[str], float]] = []
    for b, backend in enumerate(table.backends):
        per_node = [backend if np.isfinite(table.seconds[k, b]) else "reference" for k in range(len(names))]
        cost = float(sum(table.seconds[k, table.backends.index(x)] for k, x in enumerate(per_node)))
        singles.append((f"all {backend}", per_node, cost))
    fewer = search_placement(table, partition_scale=FEWER_PARTITIONS_SCALE)
    found = [("search", best.backend_of, best.seconds), *sorted(singles, key=lambda c: c[2]),
             ("search, fewer partitions", fewer.backend_of, fewer.seconds)]
    unique: dict[tuple[str, ...], tuple[str, list[str], float]] = {}
    for label, per_node, cost in found:
        unique.setdefault(tuple(per_node), (label, per_node, cost))
    chosen = list(unique.values())[:max(count, 1 + len(singles))]
    return [Candidate(label, dict(zip(names, per_node)), cost) for label, per_node, cost in chosen]


@dataclass
class FirstPass:
    """What pass 1's rules look at: the candidates, their build estimates, the clock and the budget."""

    candidates: list[Candidate]
    builds: list[float]  # estimated build seconds per candidate (0 without estimates)
    margins: Margins
    clock: Clock
    deadline: float
    budget_s: float
    estimates_builds: bool
    net: int = 0  # the candidate built whatever the budget says
    always: int | None = None  # the cheap single engine, measured first whatever the rules say
    tried_nets: set[int] = field(default_factory=set)

    @property
    def optimum_s(self) -> float:
        return self.candidates[0].modelled_s

    @property
    def optimum_is_single(self) -> bool:
        return len(set(self.candidates[0].placement.values())) == 1

    @property
    def singles(self) -> int:
        return sum(1 for c in self.candidates if c.label.startswith("all "))

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.budget_s) and self.estimates_builds

    def spent(self) -> bool:
        return self.clock() >= self.deadline

    def over(self, k: int, factor: float) -> bool:
        """Candidate k is modelled more than `factor` times the optimum."""
        return self.candidates[k].modelled_s > factor * self.optimum_s

    def close_singles(self, factor: float, exclude: frozenset[int] = frozenset()) -> list[int]:
        """The single-engine candidates (labelled so, or the optimum on one backend) modelled within `factor`
        of the optimum, less `exclude`."""
        return [k for k, c in enumerate(self.candidates) if k not in exclude and not self.over(k, factor)
                and (c.label.startswith("all ") or (k == 0 and self.optimum_is_single))]


@dataclass(frozen=True)
class Rule:
    reason: str  # written in the report for the candidate it leaves out
    holds: Callable[[FirstPass, int], bool]
    spares_net: bool = False  # the net is built even when this rule holds


# Pass 1 leaves candidate k out under the first of these that holds (never the optimum, k = 0, nor the net).
LEAVE_OUT: tuple[Rule, ...] = (
    # A variant of the optimum past the budget: left out on purpose, so the winner is still cached.
    Rule("budget spent before it was loaded", lambda p, k: k > p.singles and p.spent()),
    Rule("modelled beyond the cutoff", lambda p, k: p.over(k, p.margins.modelled_cutoff)),
    # Single engines are measured against the model misjudging a mix; an optimum on one engine already is
    # that net, so another is measured only when modelled close to it.
    Rule("the optimum is one engine; modelled slower than it",
         lambda p, k: p.optimum_is_single and p.over(k, p.margins.single_slack)
         and (p.over(k, p.margins.cheap_single_slack) or p.spent())),
    Rule("its build would overrun the budget",
         lambda p, k: p.estimates_builds and p.clock() + p.margins.build_margin * p.builds[k] > p.deadline,
         spares_net=True),
    Rule("budget spent, modelled slower than the optimum",
         lambda p, k: p.candidates[k].modelled_s >= p.optimum_s and p.spent()),
)


def leave_out_reason(p: FirstPass, k: int) -> str | None:
    """Why candidate k is not loaded, or None. The optimum, the cheap single engine and a net handed over
    to are always loaded; the net otherwise only escapes the rules that spare it."""
    if k == 0 or k == p.always or (p.tried_nets and k == p.net):
        return None
    return next((rule.reason for rule in LEAVE_OUT if rule.holds(p, k) and not (rule.spares_net and k == p.net)),
                None)


def measuring_order(builds: Sequence[float], first: int | None) -> list[int]:
    """Indices into the candidates (model order) in the order pass 1 builds them: the cheap single engine
    that is always measured (`first`), the optimum (its warm-up sets the cut the others are abandoned at),
    then the rest cheapest build first, so a dear build cannot spend the budget a cheaper one needed."""
    head = [k for k in (first, 0) if k is not None]
    return list(dict.fromkeys(head)) + sorted((k for k in range(len(builds)) if k not in head),
                                              key=lambda k: builds[k])


def cheap_single(p: FirstPass) -> int | None:
    """The single engine always measured first: of those modelled within cheap_single_slack of the optimum,
    the cheapest to build, if its estimated build fits the budget and it is not the optimum itself."""
    k = min(p.close_singles(p.margins.cheap_single_slack), key=lambda k: p.builds[k], default=0)
    return k if k and p.builds[k] <= p.budget_s else None


def next_net(p: FirstPass) -> int | None:
    """Once the net measured far slower than its model: the cheapest build among the single engines
    modelled within cheap_single_slack of the optimum and not yet tried."""
    close = p.close_singles(p.margins.cheap_single_slack, frozenset({0, *p.tried_nets}))  # all "all <backend>"
    return min(close, key=lambda k: p.builds[k], default=None)


def safety_net(candidates: Sequence[Candidate], builds: Sequence[float] | None, margins: Margins = MARGINS) -> int:
    """Under a mixed optimum without a cheap single engine: of the single engines modelled within
    single_slack of the best-modelled one, the cheapest to build (without estimates, the best-modelled)."""
    singles = [k for k, c in enumerate(candidates) if c.label.startswith("all ")]
    if not singles:
        return 0
    close = [k for k in singles if candidates[k].modelled_s <= margins.single_slack * candidates[singles[0]].modelled_s]
    return close[0] if builds is None else min(close, key=lambda k: builds[k])


def synthetic_inputs(graph: Graph) -> list[np.ndarray]:
    """Inputs to time candidates on: zeros for integers (always valid indices), normal noise for floats."""
    rng = np.random.default_rng(0)
    specs = [graph.specs[name] for name in graph.inputs]
    return [rng.standard_normal(s.shape).astype(s.dtype.np) if s.dtype.is_float else np.zeros(s.shape, s.dtype.np)
            for s in specs]


def tune_placement(graph: Graph, table: CostTable, best: SearchResult, program_hash: str,
                   count: int = DEFAULT_CANDIDATES, *, budget_s: float = math.inf,
                   loader: CandidateLoader,
                   build_estimate: Callable[[Mapping[str, str]], float] | None = None,
                   margins: Margins = MARGINS, clock: Clock = time.perf_counter, busy: BusyProbe | None = None,
                   ) -> tuple[dict[str, str], dict[str, Any], Trial | None]:
    """The measured-fastest candidate placement, a report of every candidate, and the winner loaded (None
    when it came from the cache). Pass 1 loads the candidates (LEAVE_OUT decides which) and times their
    warm-ups, freeing clear losers at once; pass 2 times the contenders left in interleaved rounds. The
    winner is cached when every candidate was measured or deliberately left out, with how busy other
    processes kept the machine as the measuring began (`busy`: machine_load.py)."""
    probe = busy or machine_load.other_cpu_busy
    cached = cached_placement(graph, program_hash, probe)
    if cached is not None:
        return cached, {"source": "cache"}, None
    busy_then = probe()
    start = clock()
    candidates = candidate_placements(graph, table, best, count)
    builds = [build_estimate(c.placement) if build_estimate is not None else 0.0 for c in candidates]
    p = FirstPass(candidates, builds, margins, clock, start + budget_s, budget_s, build_estimate is not None)
    inputs = synthetic_inputs(graph)
    always = p.always = cheap_single(p) if p.bounded else None
    p.net = 0 if p.optimum_is_single else always if always is not None \
        else safety_net(candidates, builds if build_estimate is not None else None, margins)
    warm: list[tuple[float, Candidate, Trial | None]] = []  # (warm-up seconds, candidate, loaded or freed)
    left_out: list[tuple[Candidate, str]] = []  # not loaded
    abandoned: list[tuple[Candidate, str]] = []  # loaded, warm-up cut short
    for k in measuring_order(builds, always) if p.bounded else range(len(candidates)):
        candidate = candidates[k]
        reason = leave_out_reason(p, k)
        if reason is not None:
            left_out.append((candidate, reason))
            continue
        loaded = loader(candidate.placement)
        # Bounded loads only: tune=True measures every candidate in full, for the report.
        limit = max(margins.contender_factor * min((w[0] for w in warm), default=math.inf), margins.abandon_floor_s) \
            if math.isfinite(budget_s) else math.inf
        first = warm_up_seconds(functools.partial(loaded.run, inputs), limit, clock=clock)
        if p.bounded and k == p.net and first > margins.cheap_single_slack * candidate.modelled_s:
            p.tried_nets.add(k)  # the net itself was misjudged: the next close single engine is built anyway
            p.net = next_net(p) or p.net
        if not math.isfinite(first):
            abandoned.append((candidate, f"warm-up call abandoned after {limit * 1e3:.1f} ms"))
            discard(loaded)
            continue
        warm.append((first, candidate, loaded))
        cut = margins.contender_factor * min(w[0] for w in warm)
        for culled in [w[2] for w in warm if w[0] > cut and w[2] is not None]:
            discard(culled)
        warm = [w if w[0] <= cut else (w[0], w[1], None) for w in warm]
    # Pass 2: the contenders timed as they will run; one culled after its warm-up keeps its warm-up time.
    kept = {c.label: loaded for _, c, loaded in warm if loaded is not None}
    steady: dict[str, float] = {}
    if len(kept) > 1:
        steady = steady_seconds({label: functools.partial(t.run, inputs) for label, t in kept.items()},
                                {label: t.busy_after_call_s for label, t in kept.items()},
                                {c.label: first for first, c, _ in warm}, p.deadline, clock=clock)
    measured = [(steady.get(c.label, first), c) for first, c, _ in warm]
    winner = min(measured, key=lambda m: m[0] * margins.mixed_margin ** (len(set(m[1].placement.values())) - 1))[1]
    left_out += abandoned
    complete = len(measured) + len(left_out) == len(candidates)
    considered = {c.label for _, c in measured} | {c.label for c, _ in left_out}
    report = {"source": "measured", "winner": winner.label, "complete": complete,
              "spent_s": clock() - start, "budget_s": budget_s,
              "candidates": [{"label": c.label, "measured_s": s, "modelled_s": c.modelled_s,
                              "backends": len(set(c.placement.values()))} for s, c in measured]
              + [{"label": c.label, "measured_s": None, "modelled_s": c.modelled_s, "skipped": why}
                 for c, why in left_out]
              + [{"label": c.label, "measured_s": None, "modelled_s": c.modelled_s} for c in candidates
                 if c.label not in considered]}
    if complete:
        update_tuned(program_hash, placement=winner.placement, busy=busy_then, **report)
    chosen = kept.get(winner.label)
    for label, trial in kept.items():
        if label != winner.label:
            discard(trial)
    if chosen is not None and steady:
        # The rounds may have ended on another contender whose threads still spin; the winner runs until
        # they are done, so the caller's first calls are not slowed by the measurement.
        settle_until = clock() + max((t.busy_after_call_s for label, t in kept.items() if label != winner.label),
                                     default=0.0)
        while clock() < settle_until:
            chosen.run(inputs)
    return winner.placement, report, chosen
