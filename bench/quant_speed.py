"""int8 CNNs and MiniLM: edgerun's int8 programs against the float and the int8 peers.

    .venv/bin/python bench/quant_speed.py [--models resnet18 resnet50 mobilenet_v2 minilm] [--size 224]
                                           [--calibration 32] [--runs 10] [--rounds 1] [--threads 2]
                                           [--observer minmax] [--out NAME.json]
                                           [--workdir DIR [--reuse [--requantize]] | --prepare-only]

Per CNN, from one torch module and the same --calibration natural images:
- edgerun: the float program (edgerun.export) and its int8-static quantization (reduce_range, so the ONNX
  Runtime delegate runs every layer exactly: QLinearConv), run with backends="auto" and ONNX Runtime first;
- ONNX Runtime: the module as ONNX, and quantize_static of it (QDQ, per-channel weights);
- ExecuTorch: XNNPACK-lowered float, and PT2E with XNNPACKQuantizer (symmetric, per-channel) lowered to XNNPACK;
- MNN: the ONNX file converted, and its offline int8 quantization (`_tools.mnnquant`, KL, MAX_ABS weights)
  when the tool completes (it runs in a child process: it aborts on some setups).
For `minilm`: int8-dynamic against ONNX Runtime's quantize_dynamic.

Preparing (exporting, calibrating, quantizing with every tool, converting) takes most of the run's time and
measures nothing: `--workdir DIR --reuse` keeps the prepared files in DIR and skips preparing a model whose
files are already there, so the timing rounds can run alone on an idle machine after preparing elsewhere.
`--requantize` (with --reuse) makes edgerun's int8 files again from the saved float programs, keeping every
peer's file: what a change to edgerun's quantization needs.

Each runtime times in its own process (`--worker`). With --rounds R every runtime is run once per round,
interleaved, and the ratios are the medians of each round's ratios (side by side, so a busy machine slows
both sides alike). Prints one table, a row per model x runtime x precision: median latency, the row's time
over edgerun's int8 time, the worker's peak RSS, the program file's size and the same runtime's float file
over it, and each int8 output's SQNR against the float module on a held-out image; then, per model, edgerun
int8 against the fastest float peer (a runtime other than edgerun), edgerun float, the fastest int8 peer,
ONNX Runtime's and ExecuTorch's int8, with the issue's targets (>= 2x the fastest float peer on ResNet-50,
<= 1.05x the fastest int8 peer everywhere) marked met or not, and MiniLM's embedding cosine. Writes all of
it to bench/results/quant_speed.json (--out).
"""

from __future__ import annotations

import argparse
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
from process_memory import peak_rss_mb  # bench/ is this script's directory

RESULTS_DIR = Path(__file__).resolve().parent / "results"


# ---- worker: one runtime, one file, alone in this process ----------------------------------------------

def worker(runtime: str, path: str, inputs_path: str, runs: int, threads: int) -> dict[str, Any]:
    with np.load(inputs_path) as data:
        xs = [np.ascontiguousarray(data[f"arr_{k}"]) for k in range(len(data.files))]
    start = time.perf_counter()
    if runtime in ("executorch", "mnn"):
        from peer_worker import RUNTIMES  # bench/ is this script's directory

        run = RUNTIMES[runtime](str(Path(path).with_suffix("")), xs, threads)
    elif runtime.startswith("edgerun"):
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
    first = run()
    while isinstance(first, (list, tuple)):
        first = first[0]
    np.save(f"{path}.{runtime}.out.npy", np.asarray(first, np.float32))  # the parent's SQNR
    run()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return {"latency_ms": statistics.median(times) * 1e3, "load_ms": load_s * 1e3, "peak_rss_mb": peak_rss_mb()}


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


def _executorch(module: Any, x: Any, calibration: np.ndarray | None, path: Path) -> None:
    """XNNPACK-lowered .pte: float, or PT2E-quantized with XNNPACKQuantizer calibrated on `calibration`."""
    import torch
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner
    from executorch.exir import to_edge_transform_and_lower

    exported = torch.export.export(module, (x,))
    if calibration is not None:
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(exported.module(), quantizer)
        with torch.no_grad():
            for i in range(len(calibration)):
                prepared(torch.from_numpy(calibration[i:i + 1]))
        exported = torch.export.export(convert_pt2e(prepared), (x,))
    program = to_edge_transform_and_lower(exported, partitioner=[XnnpackPartitioner()]).to_executorch()
    path.write_bytes(program.buffer)


_MNN_QUANT = """
import json, sys, _tools
_tools.mnnquant(sys.argv[1], sys.argv[2], sys.argv[3])
"""


def _mnn(onnx_path: Path, calibration: np.ndarray, workdir: Path, name: str) -> str:
    """name.mnn from the ONNX file and, if MNN's offline quantizer completes, name-int8.mnn; '' or the error."""
    import _tools  # MNN's converter binding (never MNN.tools: its usage logger)

    from edgerun.zoo.inputs import IMAGENET_MEAN, IMAGENET_STD

    _tools.mnnconvert(["mnnconvert", "-f", "ONNX", "--modelFile", str(onnx_path), "--MNNModel",
                       str(workdir / f"{name}.mnn"), "--bizCode", "edgerun-bench"])
    images = workdir / f"{name}-calibration"
    images.mkdir(exist_ok=True)
    size = calibration.shape[-1]
    for i, c in enumerate(calibration):  # back to 8-bit RGB pictures (binary PPM), MNN normalises them again
        px = np.clip(np.rint((c * IMAGENET_STD[:, None, None] + IMAGENET_MEAN[:, None, None]) * 255), 0, 255)
        (images / f"{i}.ppm").write_bytes(f"P6\n{size} {size}\n255\n".encode() + px.astype(np.uint8).transpose(1, 2, 0).tobytes())
    config = {"format": "RGB", "mean": [float(v) for v in IMAGENET_MEAN * 255],
              "normal": [float(v) for v in 1 / (IMAGENET_STD * 255)], "width": size, "height": size,
              "path": f"{images}/", "used_image_num": len(calibration), "feature_quantize_method": "KL",
              "weight_quantize_method": "MAX_ABS"}
    (workdir / f"{name}.mnnquant.json").write_text(json.dumps(config))
    out = subprocess.run([sys.executable, "-c", _MNN_QUANT, str(workdir / f"{name}.mnn"),
                          str(workdir / f"{name}-int8.mnn"), str(workdir / f"{name}.mnnquant.json")],
                         capture_output=True, text=True, timeout=1200)
    if (workdir / f"{name}-int8.mnn").exists():
        return ""
    return "MNN's quantizer: " + ((out.stderr.strip().splitlines() or ["no output"])[-1][:150])


def prepare(name: str, size: int, n_cal: int, workdir: Path, observer: str = "minmax") -> dict[str, Any]:
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    import edgerun
    from edgerun.oracle import interpret
    from edgerun.zoo import get
    from edgerun.zoo.inputs import natural_image

    module = get(name).build()
    x = natural_image(size, seed=0)
    calibration = natural_image(size, seed=1, batch=n_cal).numpy()
    np.savez(workdir / f"{name}.inputs.npz", natural_image(size, seed=2).numpy())
    program = edgerun.export(module, (x,))
    program.save(workdir / f"{name}.edgerun")
    test = natural_image(size, seed=2).numpy()
    ref = interpret(program.graph, [test])[0]
    np.save(workdir / f"{name}.ref.npy", ref)
    ours = quantize_edgerun(name, size, n_cal, workdir, observer)
    torch.onnx.export(module, (x,), str(workdir / f"{name}.onnx"), input_names=["x"], opset_version=17, dynamo=False)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{"x": calibration[i:i + 1]} for i in range(n_cal)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.items, None)
    quantize_static(str(workdir / f"{name}.onnx"), str(workdir / f"{name}-int8.onnx"), Reader(),
                    quant_format=QuantFormat.QDQ, per_channel=True, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8)
    _executorch(module, x, None, workdir / f"{name}.pte")
    _executorch(module, x, calibration, workdir / f"{name}-int8.pte")
    mnn_error = _mnn(workdir / f"{name}.onnx", calibration, workdir, name)
    ort_int8 = ort.InferenceSession(str(workdir / f"{name}-int8.onnx"), providers=["CPUExecutionProvider"])
    return {**ours, "sqnr_db_ort_int8": _sqnr(ref, ort_int8.run(None, {"x": test})[0]), "mnn_int8_error": mnn_error}


def quantize_edgerun(name: str, size: int, n_cal: int, workdir: Path, observer: str = "minmax") -> dict[str, Any]:
    """edgerun's int8 file of a prepared model, from its saved float program (int8-static on the same
    calibration images for a CNN, int8-dynamic for MiniLM): what `--requantize` redoes after a change to
    edgerun's quantization, leaving every peer's file as it is. Its output's SQNR and the time it took."""
    import edgerun
    from edgerun.oracle import interpret
    from edgerun.quantization import quantize_with_report

    program = edgerun.Program.read(workdir / f"{name}.edgerun")
    t = time.perf_counter()
    if name == "minilm":
        quantized, _ = quantize_with_report(program, "int8-dynamic", reduce_range=True, report_samples=0)
        with np.load(workdir / "minilm.inputs.npz") as data:
            test = [data[f"arr_{k}"] for k in range(len(data.files))]
    else:
        from edgerun.zoo.inputs import natural_image

        calibration = natural_image(size, seed=1, batch=n_cal).numpy()
        quantized, _ = quantize_with_report(program, "int8-static", {program.graph.inputs[0]: calibration[:, None]},
                                            reduce_range=True, report_samples=0, observer=observer)
        test = [natural_image(size, seed=2).numpy()]
    quantize_s = time.perf_counter() - t
    quantized.save(workdir / f"{name}-int8.edgerun")
    ref = np.load(workdir / f"{name}.ref.npy")
    return {"sqnr_db_edgerun_int8": _sqnr(ref.ravel(), interpret(quantized.graph, test)[0].ravel()),
            "quantize_s": quantize_s}


def prepare_minilm(workdir: Path) -> dict[str, Any]:
    """MiniLM (real weights): int8-dynamic against ONNX Runtime's quantize_dynamic of the same module."""
    import onnxruntime as ort
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic

    import edgerun
    from edgerun.oracle import interpret
    from edgerun.zoo.minilm import EXAMPLE_SENTENCES, build, tokenize

    module = build()
    args = tokenize(EXAMPLE_SENTENCES[:1])
    arrays = [a.numpy() for a in args]
    np.savez(workdir / "minilm.inputs.npz", *arrays)
    program = edgerun.export(module, args)
    program.save(workdir / "minilm.edgerun")
    ref = interpret(program.graph, arrays)[0].ravel()
    np.save(workdir / "minilm.ref.npy", ref)
    quantize_edgerun("minilm", 0, 0, workdir)
    quantized = edgerun.Program.read(workdir / "minilm-int8.edgerun")
    names = [f"input{k}" for k in range(len(args))]
    torch.onnx.export(module, args, str(workdir / "minilm.onnx"), input_names=names, opset_version=17, dynamo=False)
    quantize_dynamic(str(workdir / "minilm.onnx"), str(workdir / "minilm-int8.onnx"), weight_type=QuantType.QInt8)
    ours = interpret(quantized.graph, arrays)[0].ravel()
    peer = ort.InferenceSession(str(workdir / "minilm-int8.onnx"), providers=["CPUExecutionProvider"]).run(
        None, dict(zip(names, arrays)))[0].ravel()
    cos = {k: float(v @ ref / np.linalg.norm(v) / np.linalg.norm(ref)) for k, v in (("ours", ours), ("ort", peer))}
    return {"sqnr_db_edgerun_int8": _sqnr(ref, ours), "sqnr_db_ort_int8": _sqnr(ref, peer), "cosine": cos}


CNN_RUNS = (("edgerun", "float", "{m}.edgerun"), ("edgerun", "int8", "{m}-int8.edgerun"),
            ("edgerun-ort", "int8", "{m}-int8.edgerun"), ("onnxruntime", "float", "{m}.onnx"),
            ("onnxruntime", "int8", "{m}-int8.onnx"), ("executorch", "float", "{m}.pte"),
            ("executorch", "int8", "{m}-int8.pte"), ("mnn", "float", "{m}.mnn"), ("mnn", "int8", "{m}-int8.mnn"))
MINILM_RUNS = CNN_RUNS[:5]


def _ratios(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One round of one model: edgerun's faster int8 row (ours) against the others. A peer is a runtime other
    than edgerun; `over_ours` holds each row's latency over ours (above 1: edgerun's int8 is faster)."""
    ok = [r for r in rows if "latency_ms" in r]
    ours = min((r["latency_ms"] for r in ok if r["runtime"].startswith("edgerun") and r["precision"] == "int8"),
               default=np.nan)

    def fastest(precision: str, peers_only: bool = True, runtime: str | None = None) -> float:
        return min((r["latency_ms"] for r in ok if r["precision"] == precision
                    and (runtime is None or r["runtime"] == runtime)
                    and not (peers_only and r["runtime"].startswith("edgerun"))), default=np.nan)
    return {"fastest_float_peer_over_int8": fastest("float") / ours,
            "edgerun_float_over_int8": fastest("float", False, "edgerun") / ours,
            "int8_over_fastest_int8_peer": ours / fastest("int8"),
            "int8_over_onnxruntime_int8": ours / fastest("int8", runtime="onnxruntime"),
            "int8_over_executorch_int8": ours / fastest("int8", runtime="executorch"),
            **{f"over_ours:{r['runtime']}:{r['precision']}": r["latency_ms"] / ours for r in ok}}


# The targets: edgerun int8 at least 2x faster than the fastest float peer on ResNet-50, and at most
# 1.05x the fastest int8 peer's time on every model.
FLOAT_PEER_TARGET = {"resnet50": 2.0}
INT8_PEER_TARGET = 1.05


def _median(ratios: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in ratios if key in r and np.isfinite(r[key])]
    return float(np.median(values)) if values else float("nan")


def _verdict(value: float, target: float | None, at_least: bool) -> str:
    if target is None:
        return ""
    if not np.isfinite(value):
        return " (target: not measured)"
    met = value >= target if at_least else value <= target
    return f" (target {'>=' if at_least else '<='} {target:g}x: {'met' if met else 'NOT met'})"


def print_table(rows: list[dict[str, Any]], rounds: dict[str, list[dict[str, float]]], models: list[str]) -> dict[str, Any]:
    """The one table (a row per model x runtime x precision) and each model's ratios against the targets."""
    head = (f"{'model':13s} {'runtime':12s} {'prec':5s} {'median ms':>9s} {'it/ours':>8s} {'peak RSS MB':>11s} "
            f"{'file MB':>8s} {'float/file':>10s} {'SQNR dB':>8s}")
    print(head)
    print("-" * len(head))
    summary: dict[str, Any] = {}
    for name in models:
        ratios = rounds.get(name, [])
        mine = [r for r in rows if r["model"] == name]
        float_mb = {r["runtime"]: r["file_mb"] for r in mine if r["precision"] == "float" and "file_mb" in r}
        for r in mine:
            ms = f"{r['latency_ms']:9.1f}" if "latency_ms" in r else f"{'-':>9s}"
            rel = _median(ratios, f"over_ours:{r['runtime']}:{r['precision']}")
            source = float_mb.get("edgerun" if r["runtime"].startswith("edgerun") else r["runtime"])
            shrink = f"{source / r['file_mb']:9.1f}x" if source and r.get("file_mb") else f"{'':10s}"
            mb = f"{r['file_mb']:8.1f}" if "file_mb" in r else f"{'':8s}"
            rss = f"{r['peak_rss_mb']:11.0f}" if "peak_rss_mb" in r else f"{'':11s}"
            sq = f"{r['sqnr_db']:8.1f}" if r.get("sqnr_db") is not None else f"{'':8s}"
            rel_s = f"{rel:7.2f}x" if np.isfinite(rel) else f"{'':8s}"
            print(f"{name:13s} {r['runtime']:12s} {r['precision']:5s} {ms} {rel_s} {rss} {mb} {shrink} {sq}"
                  + (f"  {r['error']}" if "error" in r else ""))
        keys = ("fastest_float_peer_over_int8", "edgerun_float_over_int8", "int8_over_fastest_int8_peer",
                "int8_over_onnxruntime_int8", "int8_over_executorch_int8")
        summary[name] = {**{k: _median(ratios, k) for k in keys}, "rounds": ratios}
    print("\nit/ours: the row's latency over edgerun's faster int8 row (auto search or ONNX Runtime first), median"
          " of\nthe per-round ratios; float/file: the same runtime's float file over this one; SQNR against float")
    for name in models:
        m = {k: (f"{v:.2f}x" if isinstance(v, float) and np.isfinite(v) else "n/a") for k, v in summary[name].items()}
        v = summary[name]
        print(f"{name}: int8 {m['fastest_float_peer_over_int8']} faster than the fastest float peer"
              f"{_verdict(v['fastest_float_peer_over_int8'], FLOAT_PEER_TARGET.get(name), True)}, "
              f"{m['edgerun_float_over_int8']} than edgerun float; "
              f"{m['int8_over_fastest_int8_peer']} the fastest int8 peer's time"
              f"{_verdict(v['int8_over_fastest_int8_peer'], INT8_PEER_TARGET, False)} "
              f"(ONNX Runtime int8 {m['int8_over_onnxruntime_int8']}, ExecuTorch int8 {m['int8_over_executorch_int8']})")
        cosine = next((r["cosine"] for r in rows if r["model"] == name and "cosine" in r), None)
        if cosine:  # MiniLM: the embedding's cosine to float, edgerun's int8-dynamic and ONNX Runtime's
            print(f"{name}: embedding cosine to float: edgerun int8 {cosine['ours']:.5f}, ONNX Runtime int8 "
                  f"{cosine['ort']:.5f}")
    return summary


def _prepared(name: str, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Prepare one model's files in `work`, or with --reuse read back what an earlier run prepared there (the
    settings that shape the files are part of the record, so a different --size or --calibration prepares again)."""
    record = work / f"{name}.prepared.json"
    settings = {"size": args.size, "calibration": args.calibration, "observer": args.observer}
    if args.reuse and record.exists():
        saved = json.loads(record.read_text())
        if saved.get("settings") == settings:
            info = dict(saved["info"])
            if args.requantize:  # edgerun's int8 file again; the peers' files and figures stay
                info.update(quantize_edgerun(name, args.size, args.calibration, work, args.observer))
                for stale in work.glob(f"{name}-int8.edgerun.*.out.npy"):
                    stale.unlink()
                record.write_text(json.dumps({"settings": settings, "info": info}))
            return info
    info = prepare_minilm(work) if name == "minilm" else prepare(name, args.size, args.calibration, work,
                                                                  args.observer)
    record.write_text(json.dumps({"settings": settings, "info": info}))
    return info


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs=3, metavar=("RUNTIME", "PATH", "INPUTS"))
    parser.add_argument("--models", nargs="+", default=["resnet18", "resnet50", "mobilenet_v2", "minilm"],
                        help="zoo CNNs (int8-static) and/or minilm (int8-dynamic against quantize_dynamic)")
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--calibration", type=int, default=32)
    parser.add_argument("--observer", default="minmax", help="edgerun's int8-static activation observer")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved repetitions of every runtime")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="quant_speed.json", help="file name under bench/results/")
    parser.add_argument("--workdir", type=Path, help="where prepared files go (default: a temporary folder)")
    parser.add_argument("--reuse", action="store_true", help="skip preparing models already prepared in --workdir")
    parser.add_argument("--prepare-only", action="store_true", help="prepare into --workdir and time nothing")
    parser.add_argument("--requantize", action="store_true",
                        help="with --reuse: quantize edgerun's int8 files again (after a change to edgerun's "
                             "quantization), keeping every other prepared file")
    args = parser.parse_args()
    if (args.reuse or args.prepare_only) and args.workdir is None:
        parser.error("--reuse and --prepare-only need --workdir")
    if args.worker:
        print("QUANT_RESULT " + json.dumps(worker(*args.worker, args.runs, args.threads)), flush=True)
        return 0
    rows: list[dict[str, Any]] = []
    rounds: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for name in args.models:
            info = _prepared(name, work, args)
            if args.prepare_only:
                continue
            inputs = work / f"{name}.inputs.npz"
            ref = np.load(work / f"{name}.ref.npy")
            per_run: dict[tuple[str, str], list[dict[str, Any]]] = {}
            for _ in range(args.rounds):
                this_round = []
                for runtime, precision, pattern in MINILM_RUNS if name == "minilm" else CNN_RUNS:
                    file = work / pattern.format(m=name)
                    if not file.exists():
                        r: dict[str, Any] = {"error": info.get("mnn_int8_error") or f"no {file.name}"}
                    else:
                        r = _spawn(runtime, file, inputs, args.runs, args.threads)
                        r["file_mb"] = file.stat().st_size / 1e6
                        out = Path(f"{file}.{runtime}.out.npy")
                        if out.exists():
                            r["sqnr_db"] = _sqnr(ref.ravel(), np.load(out).ravel()) if precision == "int8" else None
                    r.update(runtime=runtime, precision=precision)
                    this_round.append(r)
                    per_run.setdefault((runtime, precision), []).append(r)
                rounds.setdefault(name, []).append(_ratios(this_round))
            for rs in per_run.values():
                ok = [r for r in rs if "latency_ms" in r]
                merged = dict(rs[-1])
                if ok:
                    merged["latency_ms"] = statistics.median(r["latency_ms"] for r in ok)
                    merged["peak_rss_mb"] = max(r["peak_rss_mb"] for r in ok)
                rows.append({"model": name, **merged, **{k: v for k, v in info.items() if k != "mnn_int8_error"}})
    if args.prepare_only:
        print(f"prepared {', '.join(args.models)} in {work}")
        return 0
    summary = print_table(rows, rounds, args.models)
    load = os.getloadavg()
    results = RESULTS_DIR / args.out
    results.parent.mkdir(exist_ok=True)
    results.write_text(json.dumps({"args": vars(args), "machine": platform.processor() or platform.machine(),
                                   "load_average": load, "rows": rows, "ratios": summary}, indent=1, default=str))
    print(f"\nload average {load[0]:.1f}; wrote {results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
