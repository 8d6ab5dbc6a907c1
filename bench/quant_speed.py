"""int8 CNNs and MiniLM: edgerun's int8 programs against float and against ONNX Runtime's int8.

    .venv/bin/python bench/quant_speed.py [--models resnet18 resnet50 mobilenet_v2 minilm] [--size 224]
                                           [--calibration 32] [--runs 10] [--threads 2] [--out NAME.json]

Per model: the float program (edgerun.export) and its int8-static quantization (calibrated on
--calibration natural images, reduce_range so the ONNX Runtime delegate runs the integer layers exactly);
the same torch module as ONNX and ONNX Runtime's quantize_static of it (QDQ, per-channel, same calibration
images); for `minilm`, int8-dynamic against ONNX Runtime's quantize_dynamic. Each runtime times in its
own process (`--worker`): edgerun with backends="auto" (the search places nodes on ONNX Runtime or the
reference) and with ONNX Runtime first, and ONNX Runtime on the .onnx files. Prints medians, peak RSS, file
sizes, SQNR of each int8 output against float, and ratios; writes bench/results/quant_speed.json (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# ---- worker: one runtime, one file, alone in this process ----------------------------------------------

def worker(runtime: str, path: str, inputs_path: str, runs: int, threads: int) -> dict[str, Any]:
    with np.load(inputs_path) as data:
        xs = [np.ascontiguousarray(data[f"arr_{k}"]) for k in range(len(data.files))]
    start = time.perf_counter()
    if runtime.startswith("edgerun"):
        os.environ["EDGERUN_ORT_THREADS"] = str(threads)
        from edgerun import load  # the search's load: resolves backends="auto"
        model = load(path, backends="auto" if runtime == "edgerun" else ["onnxruntime", "reference"])

        def run() -> Any:
            return model(*xs)
    else:
        import onnxruntime as ort
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
        feed = {i.name: a for i, a in zip(session.get_inputs(), xs)}

        def run() -> Any:
            return session.run(None, feed)
    load_s = time.perf_counter() - start
    for _ in range(2):
        run()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {"latency_ms": statistics.median(times) * 1e3, "load_ms": load_s * 1e3, "peak_rss_mb": _peak_rss_mb()}


def _peak_rss_mb() -> float:
    # VmHWM restarts at exec; ru_maxrss would carry the (large) preparing parent's peak into the worker.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _spawn(runtime: str, path: Path, inputs: Path, runs: int, threads: int) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, __file__, "--worker", runtime, str(path), str(inputs), "--runs", str(runs),
                          "--threads", str(threads)], capture_output=True, text=True, env=env, timeout=1800)
    for line in out.stdout.splitlines():
        if line.startswith("QUANT_RESULT "):
            return json.loads(line[len("QUANT_RESULT "):])
    return {"error": (out.stderr.strip().splitlines() or ["no output"])[-1][:200]}


# ---- preparation: float and int8 artefacts of each model -------------------------------------------------

def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    ref64 = ref.astype(np.float64)
    return float(10 * np.log10(np.sum(ref64 ** 2) / max(np.sum((ref64 - got) ** 2), 1e-30)))


def prepare(name: str, size: int, n_cal: int, workdir: Path) -> dict[str, Any]:
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    import edgerun
    from edgerun.oracle import interpret
    from edgerun.quantization import quantize_with_report
    from edgerun.zoo import get
    from edgerun.zoo.inputs import natural_image

    module = get(name).build()
    x = natural_image(size, seed=0)
    calibration = natural_image(size, seed=1, batch=n_cal).numpy()
    np.savez(workdir / f"{name}.inputs.npz", natural_image(size, seed=2).numpy())
    t = time.perf_counter()
    program = edgerun.export(module, (x,))
    program.save(workdir / f"{name}.edgerun")
    quantized, _ = quantize_with_report(program, "int8-static", {program.graph.inputs[0]: calibration[:, None]},
                                        reduce_range=True, report_samples=0)
    quantized.save(workdir / f"{name}-int8.edgerun")
    quantize_s = time.perf_counter() - t
    torch.onnx.export(module, (x,), str(workdir / f"{name}.onnx"), input_names=["x"], opset_version=17, dynamo=False)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{"x": calibration[i:i + 1]} for i in range(n_cal)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)
    quantize_static(str(workdir / f"{name}.onnx"), str(workdir / f"{name}-int8.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    test = natural_image(size, seed=2).numpy()
    ref = interpret(program.graph, [test])[0]
    ort_int8 = ort.InferenceSession(str(workdir / f"{name}-int8.onnx"), providers=["CPUExecutionProvider"])
    sizes = {k: os.path.getsize(workdir / f) / 1e6 for k, f in
             (("float", f"{name}.edgerun"), ("int8", f"{name}-int8.edgerun"), ("onnx_int8", f"{name}-int8.onnx"))}
    return {"sqnr_db_edgerun_int8": _sqnr(ref, interpret(quantized.graph, [test])[0]),
            "sqnr_db_ort_int8": _sqnr(ref, ort_int8.run(None, {"x": test})[0]),
            "file_mb": sizes, "quantize_s": quantize_s}


def prepare_minilm(workdir: Path) -> dict[str, Any]:
    """MiniLM (real weights): int8-dynamic against ONNX Runtime's quantize_dynamic of the same module."""
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    import edgerun
    from edgerun.oracle import interpret
    from edgerun.quantization import quantize_with_report
    from edgerun.zoo.minilm import EXAMPLE_SENTENCES, build, tokenize

    module = build()
    args = tokenize(EXAMPLE_SENTENCES[:1])
    arrays = [a.numpy() for a in args]
    np.savez(workdir / "minilm.inputs.npz", *arrays)
    program = edgerun.export(module, args)
    program.save(workdir / "minilm.edgerun")
    quantized, _ = quantize_with_report(program, "int8-dynamic", reduce_range=True, report_samples=0)
    quantized.save(workdir / "minilm-int8.edgerun")
    names = [f"input{k}" for k in range(len(args))]
    torch.onnx.export(module, args, str(workdir / "minilm.onnx"), input_names=names, opset_version=17, dynamo=False)
    quantize_dynamic(str(workdir / "minilm.onnx"), str(workdir / "minilm-int8.onnx"), weight_type=QuantType.QInt8)
    ref = interpret(program.graph, arrays)[0].ravel()
    ours = interpret(quantized.graph, arrays)[0].ravel()
    peer = ort.InferenceSession(str(workdir / "minilm-int8.onnx"), providers=["CPUExecutionProvider"]).run(
        None, dict(zip(names, arrays)))[0].ravel()
    cos = {k: float(v @ ref / np.linalg.norm(v) / np.linalg.norm(ref)) for k, v in (("ours", ours), ("ort", peer))}
    sizes = {k: os.path.getsize(workdir / f) / 1e6 for k, f in
             (("float", "minilm.edgerun"), ("int8", "minilm-int8.edgerun"), ("onnx_int8", "minilm-int8.onnx"))}
    return {"sqnr_db_edgerun_int8": _sqnr(ref, ours), "sqnr_db_ort_int8": _sqnr(ref, peer), "cosine": cos,
            "file_mb": sizes}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=3, metavar=("RUNTIME", "PATH", "INPUTS"))
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v2", "minilm"],
                        help="zoo CNNs (int8-static) and/or minilm (int8-dynamic against quantize_dynamic)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--calibration", type=int, default=32)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="quant_speed.json", help="file name under bench/results/")
    args = parser.parse_args()
    if args.worker:
        print("QUANT_RESULT " + json.dumps(worker(*args.worker, args.runs, args.threads)), flush=True)
        return 0
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.models:
            info = prepare_minilm(work) if name == "minilm" else prepare(name, args.size, args.calibration, work)
            inputs = work / f"{name}.inputs.npz"
            for runtime, precision, file in (("edgerun", "float", f"{name}.edgerun"),
                                             ("edgerun", "int8", f"{name}-int8.edgerun"),
                                             ("edgerun-ort", "int8", f"{name}-int8.edgerun"),
                                             ("onnxruntime", "float", f"{name}.onnx"),
                                             ("onnxruntime", "int8", f"{name}-int8.onnx")):
                r = _spawn(runtime, work / file, inputs, args.runs, args.threads)
                rows.append({"model": name, "runtime": runtime, "precision": precision, **r, **info})
    print(f"{'model':14s} {'runtime':12s} {'prec':5s} {'median ms':>10s} {'RSS MB':>8s}")
    for r in rows:
        ms = f"{r['latency_ms']:10.1f}" if "latency_ms" in r else f"{'error':>10s}"
        print(f"{r['model']:14s} {r['runtime']:12s} {r['precision']:5s} {ms} {r.get('peak_rss_mb', 0):8.0f}"
              + (f"  {r['error']}" if "error" in r else ""))
    print("\nratios use the faster edgerun int8 row (auto search or ONNX Runtime first); >1x: edgerun int8 is faster")
    print(f"{'model':14s} {'int8/fastest float':>19s} {'int8/ORT int8':>14s} {'float MB':>9s} {'int8 MB':>8s} "
          f"{'SQNR ours':>10s} {'SQNR ORT':>9s}")
    for name in args.models:
        by = {(r["runtime"], r["precision"]): r for r in rows if r["model"] == name}
        ours = min((r for k, r in by.items() if k[0].startswith("edgerun") and k[1] == "int8" and "latency_ms" in r),
                   key=lambda r: r["latency_ms"], default=by[("edgerun", "int8")])
        floats = [r["latency_ms"] for k, r in by.items() if k[1] == "float" and "latency_ms" in r]
        if "latency_ms" not in ours or not floats:
            continue
        peer = by[("onnxruntime", "int8")].get("latency_ms")
        sizes = ours["file_mb"]
        print(f"{name:14s} {min(floats) / ours['latency_ms']:18.2f}x {(peer or np.nan) / ours['latency_ms']:13.2f}x "
              f"{sizes['float']:9.1f} {sizes['int8']:8.1f} {ours['sqnr_db_edgerun_int8']:10.1f} "
              f"{ours['sqnr_db_ort_int8']:9.1f}")
    load = os.getloadavg()
    results = RESULTS_DIR / args.out
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps({"args": vars(args), "machine": platform.processor() or platform.machine(),
                                   "load_average": load, "rows": rows}, indent=1))
    print(f"\nload average {load[0]:.1f}; wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
