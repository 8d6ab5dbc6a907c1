"""Replay carved cases on a backend (TAPML's operator-wise validation) and report per op.

Each case becomes a one-node graph whose inputs are all graph inputs (weights included, as carved), compiled
on the backend once per signature and run on the carved arrays. Outputs are compared with the carved oracle
under per-dtype tolerances; an exception, or a node the backend does not support, is a failed case.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from edgerun.backends.base import Backend, CompiledPartition
from edgerun.devtools.bundle import CarvedCase, TestBundle
from edgerun.devtools.compare import ErrorStats, Tolerances, compare_arrays, worst
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.tensor_spec import TensorSpec


@dataclass
class CaseResult:
    case: CarvedCase
    stats: list[ErrorStats]  # one per output; empty when the case did not run
    error: str | None = None  # exception text, or why it did not run
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.error is None and all(s.passed for s in self.stats)

    @property
    def worst(self) -> ErrorStats | None:
        return worst(self.stats)

    def to_json(self) -> dict[str, object]:
        return {"case": self.case.id, "op": self.case.op, "node": self.case.node, "passed": self.passed,
                "error": self.error, "seconds": self.seconds, "outputs": [s.to_json() for s in self.stats]}


@dataclass
class OpRow:
    op: str
    cases: int = 0
    passed: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    nan_inf: int = 0
    max_ulp: int = 0
    worst_case: str = ""
    errors: int = 0

    @property
    def ok(self) -> bool:
        return self.passed == self.cases


@dataclass
class CheckReport:
    backend: str
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[CaseResult]:
        return [r for r in self.results if not r.passed]

    def worst_failure(self) -> CaseResult | None:
        fails = self.failures
        if not fails:
            return None
        return max(fails, key=lambda r: (r.error is not None, _sort_key(r.worst)))

    def rows(self) -> list[OpRow]:
        rows: dict[str, OpRow] = {}
        worst_abs: dict[str, float] = {}
        for r in self.results:
            row = rows.setdefault(r.case.op, OpRow(r.case.op))
            row.cases += 1
            row.passed += r.passed
            row.errors += r.error is not None
            for s in r.stats:
                row.max_abs = max(row.max_abs, s.max_abs)
                row.max_rel = max(row.max_rel, s.max_rel)
                row.nan_inf += s.nan + s.inf
                row.max_ulp = max(row.max_ulp, s.max_ulp)
            key = _sort_key(r.worst) if r.error is None else math.inf
            if not r.passed and key >= worst_abs.get(r.case.op, -1.0):
                worst_abs[r.case.op] = key
                row.worst_case = r.case.id
        return list(rows.values())

    def table(self) -> str:
        head = f"{'op':<14} {'cases':>5} {'passed':>6} {'max abs':>10} {'max rel':>10} {'NaN/Inf':>7} " \
               f"{'max ULP':>10}  worst failing case"
        lines = [f"check on {self.backend}: {len(self.results)} cases, {len(self.failures)} failed, "
                 f"{self.seconds:.3f} s", head, "-" * len(head)]
        for row in self.rows():
            mark = "" if row.ok else "  FAIL"
            lines.append(f"{row.op:<14} {row.cases:>5} {row.passed:>6} {_fmt(row.max_abs):>10} "
                         f"{_fmt(row.max_rel):>10} {row.nan_inf:>7} {row.max_ulp:>10}  {row.worst_case}{mark}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {"backend": self.backend, "passed": self.passed, "seconds": self.seconds,
                "cases": len(self.results), "failed": len(self.failures),
                "ops": [row.__dict__ for row in self.rows()],
                "failures": [r.to_json() for r in self.failures]}


def _sort_key(s: ErrorStats | None) -> float:
    if s is None:
        return 0.0
    return math.inf if not math.isfinite(s.max_abs) or s.nonfinite_mismatch else s.max_abs


def _fmt(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else str(v)


def case_graph(case: CarvedCase) -> Graph:
    """The one-node graph of a carved case: every present input is a graph input."""
    g = Graph()
    names = []
    for k, ref in enumerate(case.inputs):
        if ref.hash is None:
            names.append("")
        else:
            names.append(g.add_input(f"in{k}", TensorSpec(ref.shape, DType(ref.dtype))))
    outs = [f"out{k}" for k in range(len(case.outputs))]
    for name, ref in zip(outs, case.outputs):
        g.specs[name] = TensorSpec(ref.shape, DType(ref.dtype))
    g.nodes.append(Node(case.op, names, outs, dict(case.attrs), {}, case.node))
    g.outputs = list(outs)
    return g


class CaseRunner:
    """Runs carved cases on one backend, compiling each signature once."""

    def __init__(self, backend: Backend, bundle: TestBundle, tolerances: Tolerances | None = None) -> None:
        self.backend = backend
        self.bundle = bundle
        self.tolerances = tolerances or Tolerances()
        self._compiled: dict[str, CompiledPartition | str] = {}

    def _compile(self, case: CarvedCase) -> CompiledPartition | str:
        key = case.signature + repr([(r.shape, r.dtype) for r in case.outputs])
        hit = self._compiled.get(key)
        if hit is None:
            graph = case_graph(case)
            if not self.backend.supports(graph.nodes[0], graph):
                hit = f"backend {self.backend.name!r} does not support this {case.op} node"
            else:
                try:
                    hit = self.backend.compile(graph)
                except Exception as exc:
                    hit = f"compile failed: {type(exc).__name__}: {exc}"
            self._compiled[key] = hit
        return hit

    def run(self, case: CarvedCase) -> CaseResult:
        compiled = self._compile(case)
        if isinstance(compiled, str):
            return CaseResult(case, [], compiled)
        ins, expected = self.bundle.case_arrays(case)
        start = time.perf_counter()
        try:
            with np.errstate(all="ignore"):
                actual = compiled(*[np.array(a) for a in ins if a is not None])
        except Exception as exc:
            return CaseResult(case, [], f"{type(exc).__name__}: {exc}", time.perf_counter() - start)
        seconds = time.perf_counter() - start
        stats = [compare_arrays(np.asarray(a), np.asarray(e), self.tolerances[str(e.dtype)])
                 for a, e in zip(actual, expected)]
        return CaseResult(case, stats, None, seconds)


def check_bundle(bundle: TestBundle, backend: Backend, *, ops: Sequence[str] | None = None,
                 nodes: Sequence[str] | None = None, case_ids: Sequence[str] | None = None,
                 tolerances: Tolerances | None = None, progress: bool = False,
                 runner: CaseRunner | None = None, label: str | None = None) -> CheckReport:
    cases = bundle.select(list(ops or []), list(nodes or []), list(case_ids or []))
    runner = runner or CaseRunner(backend, bundle, tolerances)
    report = CheckReport(label or backend.name)
    start = time.perf_counter()
    it: Sequence[CarvedCase] = cases
    if progress:
        from tqdm import tqdm

        it = tqdm(cases, desc="check", unit="case", file=sys.stderr, disable=not sys.stderr.isatty())
    for case in it:
        report.results.append(runner.run(case))
    report.seconds = time.perf_counter() - start
    return report
