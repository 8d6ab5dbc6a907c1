"""Overhead of the bring-up tools (docs/benchmarks.md, "Developer tools"): carving is a one-time cost, and
checking one op's carved cases is much cheaper than one whole-model validation run.

Per model: carve time and bundle size; one whole-model validation (load the hybrid placement, run every
realistic input set, compare with the source outputs: what `migrate` does per step), median of --repeat;
one-op check (replay one op type's carved cases on a fresh runner, compile included), median over --repeat
for every op type. Target: the faulty test backend with no bug (the reference's kernels behind a second
backend), so the figures are the tools' own costs.

    .venv/bin/python bench/devtools_overhead.py [--repeat 5] [--proof-only]

Writes bench/results/devtools_overhead.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from edgerun.backends.faulty import FaultyBackend
from edgerun.backends.registry import get_backend
from edgerun.devtools.carve import carve_to
from edgerun.devtools.check import check_bundle
from edgerun.devtools.compare import Tolerances
from edgerun.devtools.fault_proof import proof_loaded, realistic_inputs
from edgerun.devtools.migrate import MODEL_TOLERANCES, compare_outputs, run_model
from edgerun.devtools.programs import InputSet, LoadedGraph, load_graph


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """Median wall seconds and median CPU seconds of this process (all its threads) over `repeat` calls."""
    walls, cpus = [], []
    for _ in range(repeat):
        w, c = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return statistics.median(walls), statistics.median(cpus)


def measure(name: str, loaded: LoadedGraph, inputs: list[InputSet], repeat: int, tmp: Path) -> dict[str, object]:
    source, target = get_backend("reference"), FaultyBackend("none")
    start = time.perf_counter()
    bundle = carve_to(loaded, inputs, tmp / f"{name}.bundle")
    carve_s = time.perf_counter() - start
    expected = run_model(loaded, [source], None, inputs)
    ops = list(dict.fromkeys(n.op for n in loaded.graph.nodes))
    first = [n.name for n in loaded.graph.nodes if n.op == ops[0]]

    def validate() -> None:
        actual = run_model(loaded, [source, target], dict.fromkeys(first, target.name), inputs)
        compare_outputs(actual, expected, Tolerances(MODEL_TOLERANCES))
    model_s, model_cpu = timed(validate, repeat)
    op_times: dict[str, float] = {}
    op_cpu: dict[str, float] = {}
    for op in ops:
        op_times[op], op_cpu[op] = timed(lambda op=op: check_bundle(bundle, target, ops=[op]), repeat)
    node_times: dict[str, float] = {}
    node_cpu: dict[str, float] = {}
    for node in {c.node for c in bundle}:
        node_times[node], node_cpu[node] = timed(lambda node=node: check_bundle(bundle, target, nodes=[node]),
                                                 repeat)
    slowest_node = max(node_times, key=lambda k: node_times[k])
    median_op = statistics.median(op_times.values())
    worst_op = max(op_times, key=lambda k: op_times[k])
    return {"model": name, "nodes": len(loaded.graph.nodes), "input_sets": len(inputs), "carve_s": carve_s,
            "cases": len(bundle), "bundle_mb": bundle.array_bytes / 1e6, "model_validation_s": model_s,
            "model_validation_cpu_s": model_cpu, "op_check_worst_cpu_s": op_cpu[worst_op],
            "ratio_worst_cpu": model_cpu / op_cpu[worst_op], "op_check_median_s": median_op, "op_check_worst_op": worst_op,
            "op_check_worst_s": op_times[worst_op], "ratio_median": model_s / median_op,
            "ratio_worst": model_s / op_times[worst_op], "op_check_s": op_times,
            "node_check_median_s": statistics.median(node_times.values()), "node_check_slowest": slowest_node,
            "node_check_slowest_s": node_times[slowest_node],
            "node_ratio_median": model_s / statistics.median(node_times.values()),
            "node_ratio_worst": model_s / node_times[slowest_node],
            "node_check_slowest_cpu_s": node_cpu[slowest_node],
            "node_ratio_worst_cpu": model_cpu / node_cpu[slowest_node]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--inputs", type=int, default=2)
    ap.add_argument("--proof-only", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        rows.append(measure("proof", proof_loaded(), realistic_inputs(args.inputs), args.repeat, tmp))
        if not args.proof_only:
            from edgerun.devtools.zoo_inputs import export_zoo, zoo_input_sets

            for name in ("llama_small", "minilm_l6"):
                export_zoo(name, tmp / f"{name}.erp")
                loaded = load_graph(tmp / f"{name}.erp")
                rows.append(measure(name, loaded, zoo_input_sets(name, loaded.graph, args.inputs), args.repeat, tmp))
    print("| model | nodes | carve (one-time) | cases | bundle MB | whole-model validation |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['nodes']} | {r['carve_s']:.2f} s | {r['cases']} | {r['bundle_mb']:.1f} | "
              f"{r['model_validation_s'] * 1e3:.1f} ms |")
    print()
    print("| model | check one op type: median / slowest | × cheaper than validation | "
          "check one node: median / slowest | × cheaper than validation |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['op_check_median_s'] * 1e3:.2f} ms / {r['op_check_worst_s'] * 1e3:.1f} ms "
              f"(`{r['op_check_worst_op']}`) | {r['ratio_median']:.0f}× / {r['ratio_worst']:.1f}× | "
              f"{r['node_check_median_s'] * 1e3:.2f} ms / {r['node_check_slowest_s'] * 1e3:.1f} ms | "
              f"{r['node_ratio_median']:.0f}× / {r['node_ratio_worst']:.1f}× |")
    print()
    print("| model | CPU s: validation | slowest op type | × | slowest node | × |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {r['model_validation_cpu_s'] * 1e3:.1f} ms | {r['op_check_worst_cpu_s'] * 1e3:.1f} ms "
              f"(`{r['op_check_worst_op']}`) | {r['ratio_worst_cpu']:.1f}× | {r['node_check_slowest_cpu_s'] * 1e3:.1f} ms "
              f"(`{r['node_check_slowest']}`) | {r['node_ratio_worst_cpu']:.1f}× |")
    out = Path(__file__).parent / "results" / "devtools_overhead.json"
    out.write_text(json.dumps({"machine": platform.platform(), "repeat": args.repeat, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
