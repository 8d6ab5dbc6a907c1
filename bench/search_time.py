"""Load-time search on every zoo model: how long the search takes (calibration excluded, it is cached per
device) and whether every partition pattern still matches the reference.

    .venv/bin/python bench/search_time.py [--models ...] [--workdir DIR] [--repeats 5]

Per model: the search time (median of --repeats calls of plan_auto on the decomposed graph: cost table +
placement DP + algorithm choice), the modelled latency, the auto placement (nodes per backend, partitions),
and the relative error against the all-reference run of: all ONNX Runtime, alternating node by node, and
auto. Programs come from `--workdir` (as written by bench/peer_prepare.py) when present, else are exported.
Writes bench/results/search_time.json. Targets: < 200 ms for ResNet-50, < 1 s for the largest zoo model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def _program(name: str, workdir: Path | None) -> tuple[Any, list[np.ndarray]]:
    from edgerun.program import Program

    if workdir is not None and (workdir / f"{name}.edgerun").exists():
        with np.load(workdir / f"{name}.inputs.npz") as data:
            inputs = [data[f"arr_{k}"] for k in range(len(data.files))]
        return Program.read(workdir / f"{name}.edgerun"), inputs
    from edgerun import zoo
    from edgerun.frontends.torch import export
    from edgerun.passes import optimize

    model = zoo.get(name)
    program = export(model.build(), model.example_inputs())
    program.graph, _ = optimize(program.graph)
    return program, [a.numpy() for a in model.example_inputs()]


def _error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-30))
               for g, w in zip(got, want))


def measure(name: str, workdir: Path | None, repeats: int, check: bool = True) -> dict[str, Any]:
    from edgerun.runtime.loader import prepare_graph
    from edgerun.search import load, plan_auto

    program, inputs = _program(name, workdir)
    graph = prepare_graph(program.graph)
    plans = [plan_auto(graph, program) for _ in range(repeats)]
    plan = plans[-1]
    result = {"model": name, "nodes": len(graph.nodes),
              "search_ms": statistics.median(p.search_s for p in plans) * 1e3,
              "search_min_ms": min(p.search_s for p in plans) * 1e3,
              "modelled_ms": plan.modelled_s * 1e3, "placement": dict(Counter(plan.placement.values())),
              "algorithms": dict(Counter(plan.algorithms.values())), "partitions": None,
              "relative_error": {}}
    if not check:
        return result
    reference = load(program)
    want = reference.run(inputs)
    nodes = [n.name for n in reference.graph.nodes]
    errors = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for label, kwargs in {"all_onnxruntime": {"backends": ["onnxruntime"]},
                              "alternating": {"placement": {n: ("onnxruntime" if k % 2 else "reference")
                                                            for k, n in enumerate(nodes)}},
                              "auto": {"backends": "auto"}}.items():
            loaded = load(program, **kwargs)  # type: ignore[arg-type]
            errors[label] = _error(loaded.run(inputs), want)
            if label == "auto":
                partitions = len(loaded.partitions)
    result.update(partitions=partitions, relative_error=errors)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-check", action="store_true", help="time the search only; skip the 4 patterns")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "search_time.json")
    args = parser.parse_args()
    from edgerun import zoo
    from edgerun.search import auto_backends, load_profiles

    load_profiles(auto_backends())  # the one-time calibration, outside the timings
    rows = []
    print("| model | nodes | search ms (median / min) | modelled ms | auto placement (nodes) | partitions | "
          "max rel. error: all ORT / alternating / auto |")
    print("|---|---:|---:|---:|---|---:|---|")
    for name in args.models or zoo.list_models():
        r = measure(name, args.workdir, args.repeats, check=not args.no_check)
        rows.append(r)
        placement = ", ".join(f"{k} {v}" for k, v in sorted(r["placement"].items()))
        e = r["relative_error"]
        errors = " / ".join(f"{e[k]:.1e}" for k in ("all_onnxruntime", "alternating", "auto")) if e else "-"
        print(f"| {name} | {r['nodes']} | {r['search_ms']:.1f} / {r['search_min_ms']:.1f} | "
              f"{r['modelled_ms']:.2f} | {placement} | {r['partitions'] or '-'} | {errors} |", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
