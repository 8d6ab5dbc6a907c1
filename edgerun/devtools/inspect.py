"""Run a program on a backend and on the reference side by side and compare every intermediate.

The backend side runs through the real runtime (placement, partitions, arena) with reshape aliasing off, and
an event sink copies each instruction's outputs as it finishes; the reference side is the plain interpreter
with a per-node hook. Values inside a delegated partition are the backend's own, so only partition outputs
are compared there. The report names the FIRST node in execution order whose output leaves tolerance: every
node before it agrees, so its inputs agree, so that is where the divergence starts. The largest error is
reported too, but it is usually downstream of the first.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.backends.base import Backend
from edgerun.devtools.backends import backend_label
from edgerun.devtools.compare import ErrorStats, Tolerances, compare_arrays
from edgerun.devtools.programs import InputSet, LoadedGraph
from edgerun.ir.graph import Node
from edgerun.oracle import interpret
from edgerun.runtime.instructions import InstructionEvent
from edgerun.runtime.loader import load


@dataclass
class NodeError:
    index: int  # position in execution (topological) order
    node: str
    op: str
    backend: str
    output: str
    stats: ErrorStats
    source: str = ""  # where the node came from (module path), when the frontend recorded it

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "node": self.node, "op": self.op, "backend": self.backend,
                "output": self.output, "source": self.source, **self.stats.to_json()}


@dataclass
class InspectReport:
    backend: str
    program: str | None
    nodes: list[NodeError] = field(default_factory=list)
    output_error: ErrorStats | None = None

    @property
    def first_divergent(self) -> NodeError | None:
        return next((n for n in self.nodes if not n.stats.passed), None)

    @property
    def largest(self) -> NodeError | None:
        if not self.nodes:
            return None
        return max(self.nodes, key=lambda n: (n.stats.nonfinite_mismatch, n.stats.violations,
                                              n.stats.max_abs if math.isfinite(n.stats.max_abs) else 1e308))

    @property
    def passed(self) -> bool:
        return self.first_divergent is None

    def summary(self) -> str:
        first, big = self.first_divergent, self.largest
        if first is None:
            return f"all {len(self.nodes)} compared values agree with the reference on {self.backend}"
        s = first.stats
        lines = [f"divergence starts at node {first.node!r} ({first.op}, #{first.index}, on {first.backend}"
                 f"{', from ' + first.source if first.source else ''}): max abs {s.max_abs:.3g}, "
                 f"SNR {s.snr_db:.1f} dB, cosine {s.cosine:.6f}, NaN {s.nan}, Inf {s.inf}"]
        if big is not None and big is not first:
            lines.append(f"largest error at node {big.node!r} ({big.op}, #{big.index}): "
                         f"max abs {big.stats.max_abs:.3g}, non-finite mismatches {big.stats.nonfinite_mismatch}")
        return "\n".join(lines)

    def table(self, limit: int = 40) -> str:
        head = f"{'#':>4} {'node':<28} {'op':<12} {'backend':<10} {'max abs':>10} {'MSE':>10} {'SNR dB':>8} " \
               f"{'cosine':>9}"
        lines = [head, "-" * len(head)]
        first = self.first_divergent
        shown = self.nodes if len(self.nodes) <= limit else \
            [n for n in self.nodes if first is None or n.index <= first.index + limit // 2][-limit:]
        for n in shown:
            s = n.stats
            mark = "  <- first divergence" if n is first else ("" if s.passed else "  x")
            lines.append(f"{n.index:>4} {n.node[:28]:<28} {n.op:<12} {n.backend[:10]:<10} {s.max_abs:>10.3g} "
                         f"{s.mse:>10.3g} {s.snr_db:>8.1f} {s.cosine:>9.6f}{mark}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        first, big = self.first_divergent, self.largest
        return {"backend": self.backend, "program": self.program, "passed": self.passed,
                "first_divergent": first.to_json() if first else None,
                "largest": big.to_json() if big else None,
                "output_error": self.output_error.to_json() if self.output_error else None,
                "nodes": [n.to_json() for n in self.nodes]}

    def save(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_json(), fh, indent=1)


def inspect_program(loaded: LoadedGraph, backend: Backend, inputs: InputSet, *,
                    ops: Sequence[str] | None = None, nodes: Sequence[str] | None = None,
                    tolerances: Tolerances | None = None) -> InspectReport:
    """Compare every intermediate of `backend` (or of a hybrid: only `ops`/`nodes` on it) with the reference."""
    graph = loaded.graph
    tolerances = tolerances or Tolerances()
    expected: dict[str, np.ndarray] = {}

    def keep(node: Node, args: list[np.ndarray], outs: list[np.ndarray]) -> None:
        expected.update(zip(node.outputs, outs))
    ref_outputs = interpret(graph, inputs, hook=keep, decompose=False)

    if ops or nodes:
        chosen = [n.name for n in graph.nodes if n.op in (ops or ()) or n.name in (nodes or ())]
        program = load(graph, ["reference", backend], placement=dict.fromkeys(chosen, backend.name),
                       alias_reshapes=False)
    else:
        program = load(graph, [backend], alias_reshapes=False)
    actual: dict[str, np.ndarray] = {}
    ran_on: dict[str, str] = {}

    def capture(event: InstructionEvent) -> None:
        for name in event.instruction.outputs:
            actual[name] = np.array(program.value(name), copy=True)
            ran_on[name] = event.backend
    outputs = program.run(inputs, sink=capture)

    label = backend_label(backend)
    report = InspectReport(label, loaded.path)
    for index, node in enumerate(graph.nodes):
        for out in node.outputs:
            if out not in actual:
                continue
            stats = compare_arrays(actual[out], expected[out], tolerances[str(expected[out].dtype)])
            where = label if ran_on[out] == backend.name else ran_on[out]
            report.nodes.append(NodeError(index, node.name, node.op, where, out, stats,
                                          node.meta.get("module_path", "")))
    outs = [compare_arrays(a, e, tolerances[str(e.dtype)]) for a, e in zip(outputs, ref_outputs)]
    report.output_error = max(outs, key=lambda s: (not s.passed, s.max_abs)) if outs else None
    return report
