"""`backends="auto"`: choose the placement on this device at load time (MNN's semi-auto search).

The candidate backends are those that declare they join `auto` (backends/registry.py) and are installed
here. Their calibrated profiles (cached per device) feed the cost model and the placement search. The search
is the runtime's placer (`AutoPlacer`, runtime/placer.py), which `load` here (`edgerun.load`) hands to the
runtime's one load path: the runtime asks it about each concrete graph and never imports it. Nothing is
written into the program: the same file makes its own choice on every machine.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from edgerun.backends.base import Backend
from edgerun.backends.registry import auto_candidates, get_backend
from edgerun.errors import BackendUnavailableError, EdgerunError
from edgerun.ir.graph import Graph
from edgerun.program import Program
from edgerun.runtime import LoadedProgram, RunnableProgram
from edgerun.runtime import load as runtime_load
from edgerun.runtime.loader import load_prepared
from edgerun.runtime.placer import CandidateLoad, Placed
from edgerun.runtime.state import StateStore
from edgerun.search.calibrate import BackendProfile, calibrated, load_profiles
from edgerun.search.cost_model import cheapest_algorithm, cost_table
from edgerun.search.placement_search import search_placement
from edgerun.search.settings_tune import Settings, cached_settings, configured, tune_settings
from edgerun.search.tune import FIRST_LOAD_BUDGET_S, synthetic_inputs, tune_placement

AUTO = "auto"


@dataclass
class AutoPlan:
    """What the search decided, and what it knew when it did (shown by `edgerun plan --backends auto`)."""

    backends: list[str]  # the candidates, in the order given to load()
    placement: dict[str, str]  # node name -> backend
    modelled_s: float
    search_s: float  # wall time of the search itself (calibration and tuning measurements excluded)
    algorithms: dict[str, str] = field(default_factory=dict)  # node -> algorithm, where its backend has a choice
    tuning: dict[str, Any] = field(default_factory=dict)  # the measured candidates (tune.py's report)
    loaded: LoadedProgram | None = field(default=None, repr=False)  # the measured winner, ready to run
    settings: Settings = field(default_factory=dict)  # backend settings tuned for this program (settings_tune.py)
    # The backends to load with: calibrated, with the tuned settings, this load's own where a setting differs
    configured: dict[str, Backend] = field(default_factory=dict, repr=False)


def auto_backends(names: Sequence[str] | None = None) -> list[Backend]:
    """The installed candidates (reference always); a named one that is missing raises, naming its extra."""
    found = []
    for name in names or auto_candidates():
        try:
            found.append(get_backend(name))
        except BackendUnavailableError:
            if names:
                raise
    if not any(b.name == "reference" for b in found):
        found.append(get_backend("reference"))
    return found


def plan_auto(graph: Graph, program: Program | None = None, *, tune: bool = False,
              candidates: Sequence[str] | None = None, measure_budget_s: float = 0.0,
              load: CandidateLoad | None = None) -> AutoPlan:
    """Place every node of `graph` (prepared for these candidates: prepare_graph) on this device's backends.

    With `measure_budget_s` > 0 the best few candidates are also loaded (by `load`, the runtime's, which
    binds the program's state; else the graph alone) and timed, within that budget, unless a winner is
    cached for this program and device; `tune=True` measures them all without a bound.
    """
    shared = {b.name: b for b in auto_backends(candidates)}
    profiles = load_profiles(list(shared.values()))
    backends = {name: calibrated(b, profiles[name]) for name, b in shared.items()}  # this load's own instances
    start = time.perf_counter()
    table = cost_table(graph, backends, profiles)
    best = search_placement(table)
    placement = {n.name: b for n, b in zip(graph.nodes, best.backend_of)}
    search_s = time.perf_counter() - start
    tuning: dict[str, Any] = {}
    loaded = None
    settings: Settings = {}
    if tune or measure_budget_s > 0:
        def loader(candidate: Mapping[str, str], using: Mapping[str, Backend] = backends) -> LoadedProgram:
            algorithms = choose_algorithms(graph, candidate, backends, profiles)
            if load is not None:
                return load(candidate, algorithms, list(using.values()))
            return load_prepared(None, graph, graph, list(using.values()), placement=candidate, algorithms=algorithms)

        # A winner is only a winner among these candidates, at these versions: the cache key names them.
        key = f"{program_key(graph, program)}.{'+'.join(sorted(b.identity() for b in backends.values()))}"
        budget_s = math.inf if tune else measure_budget_s
        tuned_from = time.perf_counter()
        placement, tuning, trial = tune_placement(graph, table, best, key, budget_s=budget_s, loader=loader,
                                                  build_estimate=functools.partial(build_seconds, graph, profiles))
        known = cached_settings(key)
        if trial is None and known is None:
            # The winner came from the cache, but the load that measured it ran out of time before its
            # settings (ORT's spinning: 2% of ResNet-50 at idle): they are tuned now, on this load's budget.
            tuned_from = time.perf_counter()
            trial = loader(placement)
        if trial is not None and (known is None or tuning.get("source") == "measured"):
            settings, trial = tune_settings(placement, trial, synthetic_inputs(graph), loader, backends, key,
                                            deadline=tuned_from + budget_s)
        else:
            settings = known or {}
        loaded = cast(LoadedProgram | None, trial)  # what `loader` loaded
    algorithms = choose_algorithms(graph, placement, backends, profiles)
    return AutoPlan(list(backends), placement, best.seconds, search_s, algorithms, tuning, loaded, settings,
                    configured(backends, settings))


def build_seconds(graph: Graph, profiles: Mapping[str, BackendProfile], placement: Mapping[str, str]) -> float:
    """Estimated seconds to compile every partition of `placement`, from the calibrated compile figures."""
    order = [placement[n.name] for n in graph.nodes]
    nodes = Counter(order)
    # Partitions follow the graph order closely enough for an estimate: one per run of a backend.
    runs = Counter(b for a, b in zip([None, *order], order) if a != b)
    weights: Counter[str] = Counter()
    for node, backend in zip(graph.nodes, order):
        weights[backend] += sum(graph.constants[v].nbytes for v in node.inputs if v in graph.constants)
    return sum(profiles[b].compile_seconds(nodes[b], weights[b], runs[b]) for b in nodes)


def choose_algorithms(graph: Graph, placement: Mapping[str, str], backends: Mapping[str, Backend],
                      profiles: Mapping[str, BackendProfile]) -> dict[str, str]:
    """Node name -> the cheapest algorithm its backend offers for it, where the backend offers a choice."""
    best = {n.name: cheapest_algorithm(n, graph, profiles[placement[n.name]], backends[placement[n.name]])
            for n in graph.nodes}
    return {name: choice[0] for name, choice in best.items() if choice is not None}


def program_key(graph: Graph, program: Program | None) -> str:
    """The program's own hash when there is a file; else a hash of the graph's structure and shapes."""
    if program is not None:
        return program.program_hash()
    h = hashlib.sha256()
    for node in graph.nodes:
        h.update(json.dumps([node.op, node.inputs, node.outputs, node.attrs], sort_keys=True, default=str).encode())
    for name, spec in sorted(graph.specs.items()):
        h.update(f"{name}:{spec.shape}:{spec.dtype.value};".encode())
    return h.hexdigest()[:32]


class AutoPlacer:
    """The runtime's placer for `backends="auto"` (runtime/placer.py): the cost model's placement, measured
    against the best few others on a program's first load here (within FIRST_LOAD_BUDGET_S, or all with
    `tune`), the winner cached per device."""

    def __init__(self, names: Sequence[str] | None = None, tune: bool = False) -> None:
        self.names, self.tune = names, tune

    def candidates(self) -> list[Backend]:
        return auto_backends(self.names)

    def place(self, program: Program | None, graph: Graph, load: CandidateLoad) -> Placed:
        plan = plan_auto(graph, program, tune=self.tune, candidates=self.names, measure_budget_s=FIRST_LOAD_BUDGET_S,
                         load=load)
        return Placed(plan.placement, plan.algorithms, list(plan.configured.values()), plan.loaded, plan)


def load(source: str | os.PathLike[str] | Program | Graph,
         backends: Sequence[str | Backend] | str | None = None, *, placement: Mapping[str, str] | None = None,
         tune: bool = False, verify_weights: bool = True, alias_reshapes: bool = True,
         arena_limit: int | None = None, state: StateStore | None = None) -> RunnableProgram:
    """`edgerun.load`: the runtime's load, with `backends="auto"` (or "auto:a,b") placed by the search.

    "auto" searches over the installed backends that join it (backends/registry.py); "auto:a,b" over
    backends a and b; `tune=True` also measures the best few placements and caches the winner per device.
    Anything else goes to the runtime as it is. Explicit `placement` entries override the search's.
    """
    placer = None
    if isinstance(backends, str) and (backends == AUTO or backends.startswith(AUTO + ":")):
        placer = AutoPlacer([n for n in backends[len(AUTO) + 1:].split(",") if n] or None, tune)
        backends = None
    elif tune:
        raise EdgerunError('tune=True needs backends="auto"')
    return runtime_load(source, backends, placer=placer, placement=placement, verify_weights=verify_weights,
                        alias_reshapes=alias_reshapes, arena_limit=arena_limit, state=state)
