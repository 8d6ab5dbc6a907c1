"""Per zoo model: latency with the model placed whole on the reference, ONNX Runtime and MNN, each backend in
its own process, and MNN's other runtime API (`MNN.nn.load_module_from_file`; the backend uses an
Interpreter session) on the same converted model.

    .venv/bin/python bench/mnn_vs_ort.py [--models mlp din ...] [--runs 20] [--threads 2] [--mnn-threads 1]

Each worker process loads the program with `backends=[NAME]` (nodes a backend does not claim stay on the
reference), runs it once to warm up, then --runs times; the median is reported with the load time, the nodes
on the backend, and the relative error against the reference output. `mnn-module` converts the whole graph
with the MNN backend's converter and times a Module's forward (only where MNN claims every node). Writes
bench/results/mnn_vs_ort.json. The box is shared: the load average is printed beside the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
BACKENDS = ("reference", "onnxruntime", "mnn", "mnn-module")


def prepare(name: str, folder: Path) -> tuple[Path, Path]:
    from edgerun import zoo
    from edgerun.frontends.torch import export
    from edgerun.passes import optimize

    model = zoo.get(name)
    program = export(model.build(), model.example_inputs())
    program.graph, _ = optimize(program.graph)
    path, inputs = folder / f"{name}.edgerun", folder / f"{name}.inputs.npz"
    program.save(path)
    np.savez(inputs, *[a.numpy() for a in model.example_inputs()])
    return path, inputs


def worker(backend: str, program: Path, inputs_path: Path, runs: int, threads: int,
           mnn_threads: int) -> dict[str, Any]:
    with np.load(inputs_path) as data:
        inputs = [data[f"arr_{k}"] for k in range(len(data.files))]
    if backend == "mnn-module":
        return _module_worker(program, inputs, runs, mnn_threads)
    import warnings

    from edgerun.runtime import load

    os.environ["EDGERUN_ORT_THREADS"] = str(threads)
    os.environ["EDGERUN_MNN_THREADS"] = str(mnn_threads)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        loaded = load(str(program), [backend])
    load_s = time.perf_counter() - start
    outputs = loaded.run(inputs)
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        loaded.run(inputs)
        times.append(time.perf_counter() - t)
    on = sum(len(p.nodes) for p in loaded.partitions if p.backend == backend)
    np.savez(program.with_suffix(f".{backend}.out.npz"), *outputs)
    return {"median_ms": statistics.median(times) * 1e3, "load_s": load_s, "nodes_on_backend": on,
            "nodes": len(loaded.graph.nodes), "partitions": len(loaded.partitions)}


def _module_worker(program: Path, inputs: list[np.ndarray], runs: int, threads: int) -> dict[str, Any]:
    """The same converted model through MNN's Module API (the alternative to the backend's session)."""
    import MNN
    import MNN.expr as F

    from edgerun.backends.mnn import MnnBackend, convert
    from edgerun.program import Program
    from edgerun.runtime.loader import prepare_graph

    graph = prepare_graph(Program.read(program).graph)
    backend = MnnBackend(threads)
    if not all(backend.supports(n, graph) for n in graph.nodes) or any(x.dtype.kind != "f" for x in inputs):
        return {"skipped": "MNN does not claim every node"}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        runtime = MNN.nn.create_runtime_manager(({"numThread": threads, "precision": "high"},))
        module = MNN.nn.load_module_from_file(str(convert(graph, Path(tmp))), list(graph.inputs),
                                              list(graph.outputs), runtime_manager=runtime, thread_num=threads,
                                              precision_mode=F.PrecisionMode.High)
    load_s = time.perf_counter() - start

    def call() -> list[np.ndarray]:
        args = [F.const(np.ascontiguousarray(x, np.float32), list(x.shape), F.NCHW) for x in inputs]
        result = []
        for var in module.forward(args):
            if var.data_format == F.NC4HW4:
                var = F.convert(var, F.NCHW)
            result.append(np.array(var.read()))
        return result

    outputs = call()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    np.savez(program.with_suffix(".mnn-module.out.npz"), *outputs)
    return {"median_ms": statistics.median(times) * 1e3, "load_s": load_s, "nodes_on_backend": len(graph.nodes),
            "nodes": len(graph.nodes), "partitions": 1}


def _error(folder: Path, name: str, backend: str) -> float | None:
    got_path = folder / f"{name}.{backend}.out.npz"
    ref_path = folder / f"{name}.reference.out.npz"
    if not got_path.exists() or not ref_path.exists():
        return None
    with np.load(got_path) as got, np.load(ref_path) as ref:
        return max(float(np.abs(got[k].astype(np.float64).reshape(ref[k].shape) - ref[k]).max()
                         / max(np.abs(ref[k]).max(), 1e-30)) for k in ref.files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="*")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2, help="ONNX Runtime's intra-op threads")
    parser.add_argument("--mnn-threads", type=int, default=1, help="MNN's threads (its pool waits busily)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--program", help=argparse.SUPPRESS)
    parser.add_argument("--inputs", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args.worker, Path(args.program), Path(args.inputs), args.runs,
                                            args.threads, args.mnn_threads)))
        return
    from edgerun import zoo

    models = args.models or zoo.list_models()
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="edgerun-mnn-bench-") as tmp:
        folder = Path(tmp)
        for name in models:
            program, inputs = prepare(name, folder)
            results[name] = {}
            for backend in BACKENDS:
                proc = subprocess.run([sys.executable, __file__, "--worker", backend, "--program", str(program),
                                       "--inputs", str(inputs), "--runs", str(args.runs),
                                       "--threads", str(args.threads), "--mnn-threads", str(args.mnn_threads)],
                                      capture_output=True, text=True, timeout=1800)
                line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
                result = json.loads(line[7:]) if line else {"error": proc.stderr.strip().splitlines()[-1:]}
                if "median_ms" in result:
                    result["relative_error"] = _error(folder, name, backend)
                results[name][backend] = result
            _print_row(name, results[name])
    load = os.getloadavg()
    print(f"measured under load (load average {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}), "
          f"{args.runs} runs, ONNX Runtime {args.threads} threads, MNN {args.mnn_threads}")
    out = HERE / "results" / "mnn_vs_ort.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"load_average": load, "runs": args.runs, "threads": args.threads,
                               "mnn_threads": args.mnn_threads,
                               "models": results}, indent=2))
    print(f"wrote {out.relative_to(HERE.parent)}")


_HEADER_DONE: list[bool] = []


def _print_row(name: str, row: dict[str, dict[str, Any]]) -> None:
    if not _HEADER_DONE:
        print(f"{'model':<14}" + "".join(f"{b + ' ms':>16}" for b in BACKENDS)
              + f"{'mnn/ort':>9}{'mnn nodes':>11}{'load ort s':>11}{'load mnn s':>11}{'mnn err':>10}")
        _HEADER_DONE.append(True)

    def ms(b: str) -> str:
        r = row.get(b, {})
        return f"{r['median_ms']:>16.3f}" if "median_ms" in r else f"{'-':>16}"

    ort, mnn = row.get("onnxruntime", {}), row.get("mnn", {})
    ratio = mnn["median_ms"] / ort["median_ms"] if "median_ms" in ort and "median_ms" in mnn else float("nan")
    nodes = f"{mnn.get('nodes_on_backend', '-')}/{mnn.get('nodes', '-')}"
    err = mnn.get("relative_error")
    print(f"{name:<14}" + "".join(ms(b) for b in BACKENDS) + f"{ratio:>9.2f}{nodes:>11}"
          f"{ort.get('load_s', float('nan')):>11.2f}{mnn.get('load_s', float('nan')):>11.2f}"
          f"{(err if err is not None else float('nan')):>10.1e}")


if __name__ == "__main__":
    main()
