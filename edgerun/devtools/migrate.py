"""Gradual target offloading (TAPML Algorithm 1): move ops from a source backend to a target one at a time.

Each step moves one unit (every node of one op type, or one node) and
1. replays the unit's carved cases on the target (operator-wise validation), then
2. runs the whole model with the hybrid placement (moved units on the target, the rest on the source) and
   compares its outputs with the pure-source run (model-wise validation).
Before each step the hybrid passed, so the first failure is the unit just moved: migration stops there and
names it, its worst case, and a command that reproduces it alone.
"""

from __future__ import annotations

import json
import math
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.backends.base import Backend
from edgerun.devtools.backends import backend_label
from edgerun.devtools.bundle import TestBundle
from edgerun.devtools.check import CaseRunner, check_bundle
from edgerun.devtools.compare import ErrorStats, Tolerance, Tolerances, compare_arrays, worst
from edgerun.devtools.programs import InputSet, LoadedGraph
from edgerun.errors import EdgerunError
from edgerun.runtime.loader import load

# Whole-model outputs go through hundreds of ops, so they get a looser default than a single op.
MODEL_TOLERANCES = {"float32": Tolerance(atol=1e-4, rtol=1e-3), "float16": Tolerance(atol=1e-2, rtol=1e-2)}


@dataclass
class StepResult:
    unit: str  # op type, or node name
    nodes: int
    cases: int
    op_passed: bool
    model_passed: bool | None  # None: not run (the op check failed first)
    model_error: ErrorStats | None
    worst_case: str | None
    worst_case_error: ErrorStats | None
    error: str | None
    seconds: float

    @property
    def passed(self) -> bool:
        return self.op_passed and bool(self.model_passed)

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.unit, "nodes": self.nodes, "cases": self.cases, "op_passed": self.op_passed,
                "model_passed": self.model_passed, "passed": self.passed,
                "model_error": self.model_error.to_json() if self.model_error else None,
                "worst_case": self.worst_case,
                "worst_case_error": self.worst_case_error.to_json() if self.worst_case_error else None,
                "error": self.error, "seconds": self.seconds}


@dataclass
class MigrationReport:
    program: str | None
    source: str
    target: str
    by: str
    steps: list[StepResult] = field(default_factory=list)
    model_runs: int = 0  # whole-model executions, the pure-source reference run included
    repro: str | None = None
    seconds: float = 0.0

    @property
    def failed(self) -> StepResult | None:
        return next((s for s in self.steps if not s.passed), None)

    @property
    def moved(self) -> list[str]:
        return [s.unit for s in self.steps if s.passed]

    @property
    def passed(self) -> bool:
        return self.failed is None

    def summary(self) -> str:
        f = self.failed
        if f is None:
            return (f"migrated all {len(self.steps)} {self.by} units from {self.source} to {self.target}; "
                    f"{self.model_runs} model runs")
        stage = "its carved cases" if not f.op_passed else "the whole-model check"
        worst_txt = f", worst case {f.worst_case}" if f.worst_case else ""
        err = f"; {f.error}" if f.error else ""
        return (f"FAILED at step {len(self.steps)}: {self.by} {f.unit!r} fails {stage} on {self.target}"
                f"{worst_txt}{err}\n  reproduce: {self.repro}")

    def to_json(self) -> dict[str, Any]:
        f = self.failed
        return {"program": self.program, "source": self.source, "target": self.target, "by": self.by,
                "passed": self.passed, "moved": self.moved, "failed": f.unit if f else None,
                "failed_stage": None if f is None else ("op" if not f.op_passed else "model"),
                "worst_case": f.worst_case if f else None, "repro": self.repro,
                "model_runs": self.model_runs, "seconds": self.seconds,
                "steps": [s.to_json() for s in self.steps]}

    def to_markdown(self) -> str:
        lines = [f"# Migration report: {self.source} → {self.target} (by {self.by})", "",
                 f"Program: `{self.program or '(in memory)'}`", "", self.summary().replace("\n", "  \n"), "",
                 "| step | unit | nodes | carved cases | op check | model check | model max abs | "
                 "model cosine | time (s) |", "|---|---|---|---|---|---|---|---|---|"]
        for k, s in enumerate(self.steps, 1):
            me = s.model_error
            lines.append(f"| {k} | `{s.unit}` | {s.nodes} | {s.cases} | {'pass' if s.op_passed else 'FAIL'} | "
                         f"{'-' if s.model_passed is None else 'pass' if s.model_passed else 'FAIL'} | "
                         f"{_g(me.max_abs) if me else '-'} | {f'{me.cosine:.6f}' if me else '-'} | "
                         f"{s.seconds:.3f} |")
        f = self.failed
        if f is not None:
            lines += ["", "## Failure", "", f"- moved unit: `{f.unit}`",
                      f"- stage: {'operator-wise (carved cases)' if not f.op_passed else 'model-wise'}"]
            if f.worst_case:
                lines.append(f"- worst case: `{f.worst_case}`")
            if f.worst_case_error:
                w = f.worst_case_error
                lines.append(f"- worst case error: max abs {_g(w.max_abs)}, max rel {_g(w.max_rel)}, "
                             f"NaN {w.nan}, Inf {w.inf}, violations {w.violations}/{w.numel}")
            if f.error:
                lines.append(f"- error: {f.error}")
            lines.append(f"- reproduce alone: `{self.repro}`")
        return "\n".join(lines) + "\n"

    def save(self, stem: str) -> tuple[str, str]:
        md, js = f"{stem}.md", f"{stem}.json"
        with open(md, "w") as fh:
            fh.write(self.to_markdown())
        with open(js, "w") as fh:
            json.dump(self.to_json(), fh, indent=1)
        return md, js


def _g(v: float) -> str:
    return f"{v:.3g}" if math.isfinite(v) else str(v)


def migration_units(loaded: LoadedGraph, by: str) -> list[tuple[str, list[str]]]:
    """(unit, node names) in order of first appearance in the graph."""
    if by == "node":
        return [(n.name, [n.name]) for n in loaded.graph.nodes]
    units: dict[str, list[str]] = {}
    for n in loaded.graph.nodes:
        units.setdefault(n.op, []).append(n.name)
    return list(units.items())


def run_model(loaded: LoadedGraph, backends: Sequence[Backend], placement: dict[str, str] | None,
              input_sets: Sequence[InputSet]) -> list[list[np.ndarray]]:
    program = load(loaded.graph, list(backends), placement=placement)
    return [program.run(inputs) for inputs in input_sets]


def compare_outputs(actual: Sequence[Sequence[np.ndarray]], expected: Sequence[Sequence[np.ndarray]],
                    tolerances: Tolerances) -> ErrorStats:
    stats = [compare_arrays(a, e, tolerances[str(e.dtype)])
             for acts, exps in zip(actual, expected) for a, e in zip(acts, exps)]
    w = worst(stats)
    assert w is not None
    return w


def migrate(loaded: LoadedGraph, input_sets: Sequence[InputSet], bundle: TestBundle, source: Backend,
            target: Backend, *, by: str = "op", tolerances: Tolerances | None = None,
            model_tolerances: Tolerances | None = None, only: Sequence[str] | None = None,
            bundle_path: str | None = None, input_paths: Sequence[str] = (),
            progress: bool = False) -> MigrationReport:
    start = time.perf_counter()
    carved_from, program_hash = bundle.meta.get("program_hash"), loaded.program_hash
    if carved_from and program_hash and carved_from != program_hash:
        raise EdgerunError(f"the bundle was carved from another program ({carved_from[:12]}), not this one "
                           f"({program_hash[:12]}); carve it again")
    if bundle.meta.get("method") != loaded.method and "method" in bundle.meta:
        raise EdgerunError(f"the bundle was carved from method {bundle.meta['method']!r}, not "
                           f"{loaded.method!r}; carve it again with --method")
    model_tolerances = model_tolerances or Tolerances(MODEL_TOLERANCES)
    report = MigrationReport(loaded.path, backend_label(source), backend_label(target), by)
    expected = run_model(loaded, [source], None, input_sets)
    report.model_runs += len(input_sets)
    runner = CaseRunner(target, bundle, tolerances)
    placement: dict[str, str] = {}
    units = [u for u in migration_units(loaded, by) if not only or u[0] in only]
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(units), desc="migrate", unit="step", file=sys.stderr, disable=not sys.stderr.isatty())
    for unit, nodes in units:
        t0 = time.perf_counter()
        check = check_bundle(bundle, target, nodes=nodes, runner=runner)
        bad = check.worst_failure()
        step = StepResult(unit, len(nodes), len(check.results), check.passed, None, None,
                          bad.case.id if bad else None, bad.worst if bad else None,
                          bad.error if bad else None, 0.0)
        if check.passed:
            placement.update(dict.fromkeys(nodes, target.name))
            try:
                actual = run_model(loaded, [source, target], placement, input_sets)
                report.model_runs += len(input_sets)
                step.model_error = compare_outputs(actual, expected, model_tolerances)
                step.model_passed = step.model_error.passed
            except Exception as exc:
                report.model_runs += 1
                step.model_passed = False
                step.error = f"{type(exc).__name__}: {exc}"
        step.seconds = time.perf_counter() - t0
        report.steps.append(step)
        if bar is not None:
            bar.update(1)
        if not step.passed:
            report.repro = repro_command(report, step, loaded, bundle_path, input_paths, placement)
            break
    if bar is not None:
        bar.close()
    report.seconds = time.perf_counter() - start
    return report


def repro_command(report: MigrationReport, step: StepResult, loaded: LoadedGraph, bundle_path: str | None,
                  input_paths: Sequence[str], placement: dict[str, str]) -> str:
    if not step.op_passed and step.worst_case:
        return shlex.join(["edgerun", "check", bundle_path or "BUNDLE", "--backend", report.target,
                           "--case", step.worst_case])
    # The unit's cases pass but the model drifts: compare every intermediate of the hybrid with the source.
    unit_flag = ["--op", step.unit] if report.by == "op" else ["--node", step.unit]
    cmd = ["edgerun", "inspect", loaded.path or "PROGRAM", "--backend", report.target, *unit_flag]
    if loaded.method is not None:
        cmd += ["--method", loaded.method]
    for p in input_paths or ["INPUTS.npz"]:
        cmd += ["--inputs", p]
    return shlex.join(cmd)
