"""Control flow at run time: silero-vad (an ONNX If on the sample rate, each branch the whole network with its
LSTM as a scan) per call, and a while_loop's cost per trip.

Rows (medians over `--runs` calls, each feeding the recurrent state back as silero's wrapper does):
  onnxruntime direct        the .onnx file in an InferenceSession (the reference point)
  edgerun onnxruntime       the imported program on ["onnxruntime", "reference"]: the cond whole as an If
  edgerun reference         the program on the reference backend: the cond's taken body loaded through the
                            runtime (runtime/control_flow.py)
  edgerun reference, 16 kHz chunk  a program imported at 576 samples, whose 8 kHz branch is left out: ONNX
                            Runtime cannot take that cond, so it runs on the reference with its body's pieces
                            on ONNX Runtime (bodies placed separately)
and the while_loop of tests/control_flow_graphs.py at 0 and 1000 trips on each backend (per-trip cost).

    .venv/bin/python bench/control_flow.py [--runs 200]

Writes bench/results/control_flow.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import edgerun  # noqa: E402
from edgerun.frontends.onnx import from_onnx  # noqa: E402


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def silero_rows(runs: int) -> list[tuple[str, float]]:
    import onnxruntime as ort

    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        return []
    path = str(Path(spec.origin).parent / "data" / "silero_vad.onnx")
    rows = []
    x = (np.random.default_rng(0).standard_normal((1, 576)) * 0.1).astype(np.float32)
    state = np.zeros((2, 1, 128), np.float32)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {"input": x, "state": state, "sr": np.array(16000)}
    rows.append(("silero 16 kHz: onnxruntime direct", _median_ms(lambda: session.run(None, feeds), runs)))
    for length, label in ((288, "288-sample program"), (576, "576-sample program, 8 kHz branch left out")):
        program = from_onnx(path, input_shapes={"input": (1, length), "state": (2, 1, 128)})
        args = {"input": x[:, :length], "state": state, "sr": np.array(16000)}
        for backends in (["onnxruntime", "reference"], ["reference"]):
            model = edgerun.load(program, backends=backends)
            call = [args[n] for n in program.graph.inputs]
            name = f"silero 16 kHz: edgerun {'+'.join(backends)}, {label}"
            rows.append((name, _median_ms(lambda model=model, call=call: model(*call), runs)))
    return rows


def while_rows(runs: int) -> list[tuple[str, float]]:
    from control_flow_graphs import while_graph

    rows = []
    x = np.ones(3, np.float32)
    for backends in (["onnxruntime", "reference"], ["reference"]):
        model = edgerun.load(while_graph(), backends=backends)
        zero = _median_ms(lambda model=model: model(x, np.array(0)), runs)
        many = _median_ms(lambda model=model: model(x, np.array(1000)), max(runs // 10, 5))
        rows.append((f"while_loop on {'+'.join(backends)}: one call, 0 trips", zero))
        rows.append((f"while_loop on {'+'.join(backends)}: per trip (1000 trips)", (many - zero) / 1000))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--json", default=str(ROOT / "bench" / "results" / "control_flow.json"))
    args = parser.parse_args()
    rows = silero_rows(args.runs) + while_rows(args.runs)
    width = max(len(name) for name, _ in rows)
    print(f"{'case':<{width}}  median ms")
    for name, ms in rows:
        print(f"{name:<{width}}  {ms:9.4f}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average {load:.1f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"rows": dict(rows), "load_average": load,
                                           "machine": platform.platform(), "runs": args.runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
