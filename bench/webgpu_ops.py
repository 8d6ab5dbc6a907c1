"""webgpu on this machine's adapter (lavapipe here, a CPU: orientation only): per-op time against the
reference backend (whole calls, and the kernels alone from timestamp queries), dispatches per zoo model before and after fusion, host ms per call with and without
capture-replay.

    python bench/webgpu_ops.py [--runs 15] [--models mlp,din,...] [--work DIR]
    python bench/webgpu_ops.py --runs 0          # dispatch counts only (nothing timed, no JSON written)

Prints tables of medians and ratios and writes bench/results/webgpu_ops.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "backends"))

from webgpu_testkit import export_small

import edgerun
from edgerun.backends.webgpu import WebGpuBackend, get_device
from edgerun.backends.webgpu.lowering import lower
from edgerun.backends.webgpu.runner import PartitionRunner
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.runtime.loader import prepare_graph

MODELS = ("mlp", "din", "squeezenet1_1", "mobilenet_v2", "shufflenet_v2", "resnet18", "resnet50", "minilm_l6",
          "llama_small", "vit_tiny")
RNG = np.random.default_rng(0)


def median_ms(fn: Callable[[], Any], runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def one_op(op: str, shapes: list[tuple[int, ...]], **attrs: Any) -> tuple[Graph, list[np.ndarray]]:
    g = Graph()
    b = Builder(g)
    names = [g.add_input(f"x{k}", TensorSpec(s, DType.float32)) for k, s in enumerate(shapes)]
    g.outputs = [b.emit(op, names, **attrs)]
    return g, [RNG.standard_normal(s).astype(np.float32) for s in shapes]


OPS: list[tuple[str, str, list[tuple[int, ...]], dict[str, Any]]] = [
    ("add 256K", "add", [(512, 512), (512, 512)], {}),
    ("exp 256K", "exp", [(512, 512)], {}),
    ("erf 256K", "erf", [(512, 512)], {}),
    ("matmul 128x256x256", "matmul", [(128, 256), (256, 256)], {}),
    ("conv3x3 16->16 32x32", "conv2d", [(1, 16, 32, 32), (16, 16, 3, 3)], {"padding": [1, 1, 1, 1]}),
    ("reduce_sum rows 512x512", "reduce_sum", [(512, 512)], {"axes": [1]}),
    ("max_pool 3x3/2 16x64x64", "max_pool2d", [(1, 16, 64, 64)], {"kernel": 3, "stride": 2}),
    ("transpose 512x512 (raster)", "raster", [(512, 512)],
     {"shape": [512, 512], "regions": [[0, 0, 0, 1, 512, 0, 0, 512, 1, 1, 512, 512]]}),
]


def per_op(runs: int) -> list[dict[str, Any]]:
    rows = []
    for label, op, shapes, attrs in OPS:
        g, feeds = one_op(op, shapes, **attrs)
        ref = edgerun.load(g)
        gpu = edgerun.load(g, ["webgpu"])
        r = median_ms(functools.partial(ref.run, feeds), runs)
        w = median_ms(functools.partial(gpu.run, feeds), runs)
        runner = WebGpuBackend().compile(g).info["runner"]
        k = statistics.median(sum(runner.kernel_seconds(feeds)) for _ in range(runs)) * 1e3
        rows.append({"op": label, "reference_ms": r, "webgpu_call_ms": w, "webgpu_kernel_ms": k,
                     "kernel / reference": k / r})
    return rows


def loaded_runner(program: Any, backend: WebGpuBackend) -> PartitionRunner:
    """The runner of `program` loaded through the runtime on `backend` alone (composites the backend claims
    reach it whole, as in any load), which must place it in one partition."""
    parts = edgerun.load(program, [backend]).parts
    assert len(parts.compiled) == 1, [p.backend for p in parts.partitions]
    runner = parts.compiled[0].info["runner"]
    assert isinstance(runner, PartitionRunner)
    return runner


def dispatch_counts(models: list[str], work: str) -> list[dict[str, Any]]:
    """Dispatches per call: one per atomic node (every composite decomposed, no fusion), and as the runtime
    loads the model on webgpu (composites the backend claims whole, its fusion pass, merged dispatches up to
    the adapter's binding limit)."""
    rows = []
    for name in models:
        program, _ = export_small(name, work)
        graph = prepare_graph(program.graph)
        rows.append({"model": name, "nodes": len(graph.nodes), "dispatches_unfused": len(lower(graph, False)),
                     "dispatches_fused": len(loaded_runner(program, WebGpuBackend()).kernels)})
    return rows


def replay_timing(models: list[str], work: str, runs: int) -> list[dict[str, Any]]:
    rows = []
    for name in models:
        program, feeds = export_small(name, work)
        row: dict[str, Any] = {"model": name}
        for replay in (False, True):
            runner = loaded_runner(program, WebGpuBackend(replay=replay))
            graph = runner.graph
            outs = [np.empty(graph.specs[o].shape, graph.specs[o].dtype.np) for o in graph.outputs]
            inputs = [np.asarray(f) for f in feeds]
            row["dispatches_per_call"] = len(runner.kernels)
            key = "replay" if replay else "fresh"
            row[f"call_ms_{key}"] = median_ms(functools.partial(runner.run, inputs, outs), runs)
            # Host time to produce the dispatch list alone: a fresh encode builds it, a replay reuses it.
            row[f"encode_ms_{key}"] = 0.0 if replay else median_ms(runner.encode_fresh, runs)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    fmt = [f"{v:.3f}" if isinstance(v, float) else str(v) for r in rows for v in r.values()]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for i in range(len(rows)):
        lines.append("| " + " | ".join(fmt[i * len(keys):(i + 1) * len(keys)]) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--replay-models", default="mlp,din")
    ap.add_argument("--work", default="/tmp/webgpu_migrate")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    load = os.getloadavg()
    if args.runs == 0:
        print(f"adapter: {get_device().description}; load average {load[0]:.1f}; dispatches per call")
        print(table(dispatch_counts(args.models.split(","), args.work)))
        return
    result = {"adapter": get_device().description, "load_average": load, "runs": args.runs,
              "per_op": per_op(args.runs),
              "dispatches": dispatch_counts(args.models.split(","), args.work),
              "replay": replay_timing(args.replay_models.split(","), args.work, args.runs)}
    result["load_average_end"] = os.getloadavg()
    print(f"adapter: {result['adapter']}; load average {load[0]:.1f} at start, "
          f"{result['load_average_end'][0]:.1f} at end; medians of {args.runs} calls")
    for key in ("per_op", "dispatches", "replay"):
        print(f"\n{key}\n{table(result[key])}")
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "webgpu_ops.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
