"""Reduce a failing program to a small subgraph that still fails, and save it as a program (delta debugging,
as Polygraphy's `debug reduce` and MNN's DEBUG mode do).

The predicate is "the backend raises" (crash), "an output leaves tolerance against the reference" (error),
or either (fail). Two phases, each probe one small run on the backend plus one on the reference:
1. bisect the shortest topological prefix that fails; its outputs are the values it hands to the rest of the
   graph, so a fault anywhere inside shows; the last node of that prefix is where the failure appears;
2. keep only that node's ancestors; try the node alone, fed its reference inputs; else walk them in order and turn each into a graph input fed with its
   reference value, keeping every cut after which the failure persists.
What remains is a connected subgraph, often the faulty node alone, with the exact inputs that trigger it.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from edgerun.backends.base import Backend
from edgerun.devtools.compare import Tolerances, compare_arrays
from edgerun.devtools.programs import InputSet, LoadedGraph, save_inputs
from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph, Node
from edgerun.oracle import interpret
from edgerun.runtime.loader import load

PREDICATES = ("fail", "crash", "error")


@dataclass
class ReduceResult:
    graph: Graph
    inputs: InputSet
    nodes_before: int
    probes: int
    reason: str  # what the reduced program does wrong
    history: list[int] = field(default_factory=list)  # node count after each accepted step

    def save(self, path: str, metadata: Mapping[str, object] | None = None) -> str:
        from edgerun.program import Program
        from edgerun.program.program import default_metadata

        meta = default_metadata()
        meta.update({"reduced_from_nodes": self.nodes_before, "reduce_reason": self.reason, **(metadata or {})})
        Program(graph=self.graph, metadata=meta).save(path)
        inputs_path = f"{path}.inputs.npz"
        save_inputs(inputs_path, self.inputs)
        return inputs_path


class _Probe:
    def __init__(self, backend: Backend, predicate: str, tolerances: Tolerances) -> None:
        if predicate not in PREDICATES:
            raise EdgerunError(f"predicate must be one of {PREDICATES}, got {predicate!r}")
        self.backend, self.predicate, self.tolerances = backend, predicate, tolerances
        self.count = 0

    def __call__(self, graph: Graph, inputs: InputSet) -> str | None:
        """Why `graph` fails on the backend under the predicate, or None when it passes."""
        self.count += 1
        feed = {n: inputs[n] for n in graph.inputs}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                actual = load(graph, [self.backend]).run(feed)
        except Exception as exc:
            return f"crash: {type(exc).__name__}: {exc}" if self.predicate in ("fail", "crash") else None
        if self.predicate == "crash":
            return None
        with np.errstate(all="ignore"):
            expected = interpret(graph, feed, decompose=False)
        for name, a, e in zip(graph.outputs, actual, expected):
            s = compare_arrays(a, e, self.tolerances[str(e.dtype)])
            if not s.passed:
                return (f"error: output {name} max abs {s.max_abs:.3g}, NaN {s.nan}, Inf {s.inf}, "
                        f"{s.violations}/{s.numel} elements out of tolerance")
        return None


def subgraph(graph: Graph, nodes: Iterable[Node], outputs: list[str], cut: set[str]) -> Graph:
    """`nodes` (in graph order) as a graph computing `outputs`; values in `cut` and original inputs they
    read become graph inputs. Nodes nothing needs are dropped."""
    chosen = [n for n in nodes if not set(n.outputs) <= cut]
    needed, keep = set(outputs), []
    for n in reversed(chosen):
        if needed & set(n.outputs):
            keep.append(n)
            needed.update(i for i in n.inputs if i)
    keep.reverse()
    produced = {o for n in keep for o in n.outputs}
    used = {i for n in keep for i in n.inputs if i} | set(outputs)
    inputs = [v for v in dict.fromkeys([*graph.inputs, *sorted(cut)]) if v in used and v not in produced
              and v not in graph.constants]
    g = Graph(inputs, list(outputs), [Node(n.op, list(n.inputs), list(n.outputs), dict(n.attrs), dict(n.meta),
                                           n.name) for n in keep],
              {v: graph.specs[v] for v in used | produced}, {v: graph.constants[v] for v in used if v in graph.constants})
    return g


def _prefix_outputs(graph: Graph, k: int) -> list[str]:
    inside = graph.nodes[:k]
    produced = {o for n in inside for o in n.outputs}
    later = {i for n in graph.nodes[k:] for i in n.inputs} | set(graph.outputs)
    outs = [o for n in inside for o in n.outputs if o in later]
    return list(dict.fromkeys([*outs, *inside[-1].outputs])) if inside else [o for o in outs if o in produced]


def reduce_program(loaded: LoadedGraph, backend: Backend, inputs: InputSet, *, predicate: str = "fail",
                   tolerances: Tolerances | None = None) -> ReduceResult:
    graph = loaded.graph
    probe = _Probe(backend, predicate, tolerances or Tolerances())
    values: dict[str, np.ndarray] = dict(inputs)

    def keep(node: Node, args: list[np.ndarray], outs: list[np.ndarray]) -> None:
        values.update(zip(node.outputs, outs))
    with np.errstate(all="ignore"):
        interpret(graph, inputs, hook=keep, decompose=False)
    reason = probe(graph, values)
    if reason is None:
        raise EdgerunError(f"the program does not {predicate} on {backend.name} with these inputs")

    lo, hi = 1, len(graph.nodes)  # invariant: prefix(hi) fails
    while lo < hi:
        mid = (lo + hi) // 2
        g = subgraph(graph, graph.nodes[:mid], _prefix_outputs(graph, mid), set())
        if probe(g, values) is not None:
            hi = mid
        else:
            lo = mid + 1
    culprit = graph.nodes[hi - 1]
    nodes = graph.nodes[:hi]
    outputs = list(culprit.outputs)
    current = subgraph(graph, nodes, outputs, set())
    cut: set[str] = set()
    if probe(current, values) is None:  # the failure needs more than the culprit's own outputs
        outputs = _prefix_outputs(graph, hi)
        current = subgraph(graph, nodes, outputs, set())
    history = [len(current.nodes)]
    # Usually the culprit alone, fed its reference inputs, still fails: try that in one probe first.
    alone = subgraph(graph, nodes, outputs, {i for i in culprit.inputs if i} - set(graph.constants))
    if len(alone.nodes) < len(current.nodes) and probe(alone, values) is not None:
        cut = {i for i in culprit.inputs if i}
        current = alone
        history.append(len(current.nodes))
    for node in list(current.nodes):
        if node is current.nodes[-1] or set(node.outputs) & set(outputs):
            continue
        trial = subgraph(graph, nodes, outputs, cut | set(node.outputs))
        if len(trial.nodes) < len(current.nodes) and probe(trial, values) is not None:
            cut |= set(node.outputs)
            current = trial
            history.append(len(current.nodes))
    final_reason = probe(current, values) or reason
    feed = {n: np.asarray(values[n]) for n in current.inputs}
    return ReduceResult(current, feed, len(graph.nodes), probe.count, final_reason, history)
