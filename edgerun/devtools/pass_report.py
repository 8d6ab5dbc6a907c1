"""`python -m edgerun.devtools.pass_report`: the default pipeline's op counts on every zoo model, as markdown.

Exports each model with the torch frontend (torch is imported lazily: the passes themselves need numpy
alone), runs `optimize`, and checks the optimised graph against the unoptimised one on the reference
interpreter. docs/passes.md holds its output.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgerun.passes.base import Pass


def _relative(got: np.ndarray, want: np.ndarray) -> float:
    g, w = got.astype(np.float64), want.astype(np.float64)
    return float(np.abs(g - w).max()) / max(float(np.abs(w).max()), 1e-30)


@dataclass
class ZooRow:
    model: str
    exported: int
    decomposed: int
    optimized: int
    rasters: tuple[int, int]  # after decomposition, after the pipeline
    weight_bytes: tuple[int, int]  # exported, after the pipeline
    error: float  # max relative difference of the outputs, optimised against unoptimised
    seconds: float
    # Max relative error of each graph against the torch model run in float64: how far fp32 itself is off.
    plain_vs_fp64: float
    optimized_vs_fp64: float


def _float64_outputs(module: Any, args: tuple[Any, ...]) -> list[np.ndarray]:
    import torch

    with torch.no_grad():
        out = module.double()(*[a.double() if a.is_floating_point() else a for a in args])
    return [t.numpy() for t in ([out] if isinstance(out, torch.Tensor) else out)]


def zoo_rows(names: list[str]) -> list[ZooRow]:
    """One row per model: op and raster counts before and after, weights, errors, pipeline time."""
    from edgerun import zoo
    from edgerun.frontends.torch import export_graph
    from edgerun.oracle import interpret
    from edgerun.passes.pipeline import optimize

    rows = []
    for name in names:
        spec = zoo.get(name)
        args = spec.example_inputs()
        graph = export_graph(spec.build(), args)
        start = time.perf_counter()
        optimized, records = optimize(graph, verify_each=False)
        seconds = time.perf_counter() - start
        arrays = [a.numpy() for a in args]
        plain_out = interpret(graph, arrays)
        optimized_out = interpret(optimized, arrays)
        error = max(_relative(got, want) for want, got in zip(plain_out, optimized_out))
        exact = _float64_outputs(spec.build(), args)
        decomposed = records[0].ops_after
        rows.append(ZooRow(name, len(graph.nodes), sum(decomposed.values()), len(optimized.nodes),
                           (decomposed.get("raster", 0), optimized.op_counts().get("raster", 0)),
                           (graph.weight_bytes(), optimized.weight_bytes()), error, seconds,
                           max(_relative(got, want) for want, got in zip(exact, plain_out)),
                           max(_relative(got, want) for want, got in zip(exact, optimized_out))))
        print(f"{name}: done", file=sys.stderr)
    return rows


def rows_markdown(rows: list[ZooRow]) -> str:
    lines = ["| model | exported ops | after decompose | after pipeline | cut | rasters | weights MB | "
             "optimised vs unoptimised | unoptimised vs fp64 | optimised vs fp64 | pipeline s |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cut = 100 * (r.decomposed - r.optimized) / max(r.decomposed, 1)
        lines.append(f"| {r.model} | {r.exported} | {r.decomposed} | {r.optimized} | {cut:.0f}% | "
                     f"{r.rasters[0]} → {r.rasters[1]} | {r.weight_bytes[0] / 1e6:.2f} → "
                     f"{r.weight_bytes[1] / 1e6:.2f} | {r.error:.1e} | {r.plain_vs_fp64:.1e} | "
                     f"{r.optimized_vs_fp64:.1e} | {r.seconds:.2f} |")
    return "\n".join(lines)


def _orders() -> dict[str, list[type[Pass]]]:
    from edgerun import passes as p

    decompose, fold, conv_fold = p.DecomposePass, p.ConstantFoldPass, p.ConvAffineFoldPass
    cse, merge, dead = p.CommonSubexpressionPass, p.RasterMergePass, p.DeadCodePass
    return {
        "decompose, fold, conv fold, raster merge, dead code": [decompose, fold, conv_fold, merge, dead],
        "decompose, raster merge, fold, conv fold, dead code": [decompose, merge, fold, conv_fold, dead],
        "decompose, conv fold, fold, raster merge, dead code": [decompose, conv_fold, fold, merge, dead],
        "the first order, then fold, raster merge, dead code again":
            [decompose, fold, conv_fold, merge, dead, fold, merge, dead],
        "decompose, fold, conv fold, cse, raster merge, dead code (default)":
            [decompose, fold, conv_fold, cse, merge, dead],
        "decompose, fold, conv fold, raster merge, cse, dead code": [decompose, fold, conv_fold, merge, cse, dead],
    }


def orders_markdown(names: list[str]) -> str:
    """Total nodes over the models after each candidate pass order (each model exported once)."""
    from edgerun import zoo
    from edgerun.frontends.torch import export_graph
    from edgerun.passes.pipeline import optimize

    graphs = []
    for name in names:
        spec = zoo.get(name)
        graphs.append(export_graph(spec.build(), spec.example_inputs()))
        print(f"{name}: exported", file=sys.stderr)
    lines = ["| order | nodes |", "|---|---:|"]
    for label, passes in _orders().items():
        total = sum(len(optimize(g, [p() for p in passes], verify_each=False)[0].nodes) for g in graphs)
        lines.append(f"| {label} | {total} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgerun.devtools.pass_report", description=__doc__)
    parser.add_argument("models", nargs="*", help="zoo model names (default: all)")
    parser.add_argument("--orders", action="store_true", help="compare pass orders instead")
    args = parser.parse_args(argv)
    from edgerun import zoo

    names = args.models or zoo.list_models()
    print(orders_markdown(names) if args.orders else rows_markdown(zoo_rows(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
