"""`backends="auto"`: choose the placement on this device at load time (MNN's semi-auto search).

The candidate backends are those of AUTO_BACKENDS that are installed here. Their calibrated profiles (cached
per device) feed the cost model; the placement search returns a backend per node, and the reference
backend's convolutions get their cheapest algorithm recorded in node.meta["algorithm"] (on copies of the
nodes: the caller's graph is never changed). With tune=True the best few candidate placements are measured
and the winner is cached per (device, program). Nothing is written into the program: the same file makes
its own choice on every machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from edgerun.backends.base import Backend
from edgerun.backends.reference.algorithms import choose_conv_algorithm
from edgerun.backends.registry import get_backend
from edgerun.errors import BackendUnavailableError, EdgerunError
from edgerun.ir.graph import Graph
from edgerun.search.calibrate import load_profiles
from edgerun.search.cost_model import cost_table
from edgerun.search.placement_search import search_placement
from edgerun.search.tune import tune_placement

if TYPE_CHECKING:
    from edgerun.program import Program

AUTO = "auto"
AUTO_BACKENDS = ("onnxruntime", "reference")


@dataclass
class AutoPlan:
    """What the search decided, and what it knew when it did (shown by `edgerun plan --backends auto`)."""

    backends: list[str]  # the candidates, in the order given to load()
    placement: dict[str, str]  # node name -> backend
    modelled_s: float
    search_s: float  # wall time of the search itself (calibration and tuning measurements excluded)
    algorithms: dict[str, str] = field(default_factory=dict)  # conv node -> reference algorithm
    tuning: dict[str, Any] = field(default_factory=dict)


def auto_backends(names: Sequence[str] | None = None) -> list[Backend]:
    """The installed candidates (reference always); a named one that is missing raises, naming its extra."""
    found = []
    for name in names or AUTO_BACKENDS:
        try:
            found.append(get_backend(name))
        except BackendUnavailableError:
            if names:
                raise
    if not any(b.name == "reference" for b in found):
        found.append(get_backend("reference"))
    return found


def plan_auto(graph: Graph, program: Program | None = None, *, tune: bool = False,
              candidates: Sequence[str] | None = None) -> AutoPlan:
    """Place every node of `graph` (decomposed, verified) on this device's backends."""
    backends = {b.name: b for b in auto_backends(candidates)}
    profiles = load_profiles(list(backends.values()))
    start = time.perf_counter()
    table = cost_table(graph, backends, profiles)
    best = search_placement(table)
    placement = {n.name: b for n, b in zip(graph.nodes, best.backend_of)}
    algorithms = {}
    if "reference" in profiles:
        for node in graph.nodes:
            if node.op == "conv2d" and placement[node.name] == "reference":
                algorithms[node.name] = choose_conv_algorithm(node, graph, profiles["reference"]).algorithm.name
    search_s = time.perf_counter() - start
    tuning: dict[str, Any] = {}
    if tune:
        placement, tuning = tune_placement(graph, table, best, program_key(graph, program))
    algorithms = {n: a for n, a in algorithms.items() if placement[n] == "reference"}
    return AutoPlan(list(backends), placement, best.seconds, search_s, algorithms, tuning)


def with_algorithms(graph: Graph, algorithms: dict[str, str]) -> Graph:
    """`graph` with node.meta["algorithm"] set for the reference backend to bind. Annotated nodes are new
    objects, so the caller's graph (which a Program may save later) never carries a device's choice."""
    if not algorithms:
        return graph
    nodes = [dataclasses.replace(n, meta={**n.meta, "algorithm": algorithms[n.name]}) if n.name in algorithms
             else n for n in graph.nodes]
    return Graph(graph.inputs, graph.outputs, nodes, graph.specs, graph.constants)


def program_key(graph: Graph, program: Program | None) -> str:
    """The program's own hash when there is a file; else a hash of the graph's structure and shapes."""
    if program is not None:
        return program.program_hash()
    h = hashlib.sha256()
    for node in graph.nodes:
        h.update(json.dumps([node.op, node.inputs, node.outputs, node.attrs], sort_keys=True, default=str).encode())
    for name in sorted(graph.specs):
        spec = graph.specs[name]
        h.update(f"{name}:{spec.shape}:{spec.dtype.value};".encode())
    return h.hexdigest()[:32]


def resolve_request(backends: object, graph: Graph, program: Program | None,
                    tune: bool) -> tuple[list[str] | None, dict[str, str] | None, Graph]:
    """Turn load()'s `backends` argument into (preference list, forced placement, graph to run).

    "auto" searches; "auto:a,b" searches over backends a and b; any other string names one backend.
    """
    if not isinstance(backends, str):
        if tune:
            raise EdgerunError('tune=True needs backends="auto"')
        return None, None, graph
    if backends == AUTO or backends.startswith(AUTO + ":"):
        names = [n for n in backends[len(AUTO) + 1:].split(",") if n] or None
        plan = plan_auto(graph, program, tune=tune, candidates=names)
        return plan.backends, plan.placement, with_algorithms(graph, plan.algorithms)
    if tune:
        raise EdgerunError('tune=True needs backends="auto"')
    return [backends], None, graph
