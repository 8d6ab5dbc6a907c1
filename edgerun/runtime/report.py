"""Reports on a loaded program: the placement table (estimated against measured cost) and the memory plan."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.runtime.instructions import EventRecorder
from edgerun.runtime.loaded_program import LoadedProgram


def random_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs matching the graph's specs: normal floats, small non-negative integers (safe as indices)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        spec = graph.specs[name]
        if spec.dtype.is_float:
            out[name] = rng.standard_normal(spec.shape).astype(spec.dtype.np)
        elif spec.dtype is DType.bool:
            out[name] = rng.random(spec.shape) < 0.5
        else:
            out[name] = rng.integers(0, 2, spec.shape).astype(spec.dtype.np)
    return out


@dataclass(frozen=True)
class PartitionCost:
    index: int
    backend: str
    ops: int
    estimated_s: float  # the backend's cost model, plus transfers of values crossing in from other backends
    measured_s: float | None  # median over runs of the partition's instructions


def estimate_partitions(m: LoadedProgram) -> list[float]:
    graph, backends = m.graph, m.parts.backends
    owner = {o: p.backend for p in m.partitions for n in p.nodes for o in n.outputs}
    estimates = []
    for p in m.partitions:
        backend = backends[p.backend]
        seconds = sum(backend.estimate_seconds(n, graph) for n in p.nodes)
        for v in p.inputs:
            if owner.get(v, "reference") != p.backend:
                seconds += backend.transfer_cost(graph.specs[v].nbytes)
        estimates.append(seconds)
    return estimates


def measure_partitions(m: LoadedProgram, inputs: dict[str, np.ndarray], runs: int = 5) -> list[float]:
    """Median seconds per partition over `runs` profiled calls (after one warm-up call)."""
    m.run(inputs)
    per_run: list[dict[object, float]] = []
    recorder = EventRecorder()
    for _ in range(runs):
        recorder.clear()
        m.run(inputs, sink=recorder)
        per_run.append(recorder.seconds_by(lambda e: e.partition))
    return [statistics.median(r.get(p.index, 0.0) for r in per_run) for p in m.partitions]


def partition_costs(m: LoadedProgram, inputs: dict[str, np.ndarray] | None, runs: int = 5) -> list[PartitionCost]:
    estimated = estimate_partitions(m)
    measured: list[float | None] = list(measure_partitions(m, inputs, runs)) if inputs is not None \
        else [None] * len(m.partitions)
    return [PartitionCost(p.index, p.backend, len(p.nodes), e, t)
            for p, e, t in zip(m.partitions, estimated, measured)]


def format_placement_table(costs: list[PartitionCost]) -> str:
    rows = [("partition", "backend", "ops", "estimated ms", "profiled now ms", "ratio")]
    for c in costs:
        measured = "-" if c.measured_s is None else f"{c.measured_s * 1e3:.3f}"
        ratio = "-" if not c.measured_s or not c.estimated_s else f"{c.measured_s / c.estimated_s:.2f}"
        rows.append((f"p{c.index}", c.backend, str(c.ops), f"{c.estimated_s * 1e3:.3f}", measured, ratio))
    total_est = sum(c.estimated_s for c in costs)
    total_meas = None if any(c.measured_s is None for c in costs) else sum(c.measured_s or 0 for c in costs)
    rows.append(("total", "", str(sum(c.ops for c in costs)), f"{total_est * 1e3:.3f}",
                 "-" if total_meas is None else f"{total_meas * 1e3:.3f}", ""))
    return _table(rows)


def format_memory_plan(m: LoadedProgram) -> str:
    plan = m.plan
    rows = [("arena", f"{plan.arena_bytes:,} B", f"planner {plan.algorithm}"),
            ("lower bound", f"{plan.lower_bound:,} B", f"arena / bound = {plan.ratio_to_lower_bound:.3f}"),
            ("naive sum", f"{plan.naive_bytes:,} B",
             f"arena / naive = {plan.arena_bytes / plan.naive_bytes:.3f}" if plan.naive_bytes else ""),
            ("planned values", str(len(plan.values)), f"{len(plan.aliases)} reshapes share their input's bytes")]
    return _table(rows, header=False)


def _table(rows: Sequence[Sequence[str]], header: bool = True) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 or not header else cell.rjust(w)
                       for i, (cell, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    if header:
        lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
