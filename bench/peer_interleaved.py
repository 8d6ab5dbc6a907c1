"""edgerun (backends="auto") against ONNX Runtime on the torch.onnx.export model, in one process, timed in
alternating blocks: a cross-check of bench/peers.py that a shared machine's load drifts cannot bias, since
both runtimes see the same moments.

    .venv/bin/python bench/peer_interleaved.py --workdir DIR [--models ...] [--blocks 5] [--runs 5]

Needs the artefacts of bench/peer_prepare.py in DIR. ORT runs with 2 threads and its pool not spinning (as
the delegate does); edgerun's delegate is the same ORT, so a gap here is the graph each one hands ORT plus
edgerun's per-call overhead. Writes bench/results/peer_interleaved.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent


def _ort(path: Path, inputs: list[np.ndarray], threads: int) -> Callable[[], Any]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feed = {i.name: a for i, a in zip(session.get_inputs(), inputs)}
    return lambda: session.run(None, feed)


def compare(model: str, workdir: Path, blocks: int, runs: int, threads: int) -> dict[str, Any]:
    from edgerun.search import load

    with np.load(workdir / f"{model}.inputs.npz") as data:
        inputs = [np.ascontiguousarray(data[f"arr_{k}"]) for k in range(len(data.files))]
    loaded = load(workdir / f"{model}.edgerun", backends="auto")
    calls = {"edgerun": lambda: loaded.run(inputs), "onnxruntime": _ort(workdir / f"{model}.onnx", inputs, threads)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call()
        call()
    for _ in range(blocks):
        for name, call in calls.items():
            for _ in range(runs):
                start = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    return {"model": model, "median_ms": medians, "ratio": medians["edgerun"] / medians["onnxruntime"],
            "samples": blocks * runs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--models", nargs="*")
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "peer_interleaved.json")
    args = parser.parse_args()
    models = args.models or sorted(p.name.removesuffix(".edgerun") for p in args.workdir.glob("*.edgerun"))
    rows = []
    print("| model | edgerun ms | ONNX Runtime (no spin) ms | edgerun / ORT |")
    print("|---|---:|---:|---:|")
    for model in models:
        r = compare(model, args.workdir, args.blocks, args.runs, args.threads)
        rows.append(r)
        print(f"| {model} | {r['median_ms']['edgerun']:.3f} | {r['median_ms']['onnxruntime']:.3f} | "
              f"{r['ratio']:.2f} |", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
