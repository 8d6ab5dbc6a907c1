"""Models made by ONNX Runtime's own tools, imported by edgerun and compared with ONNX Runtime.

    .venv/bin/python bench/ort_made_models.py            # every model below
    .venv/bin/python bench/ort_made_models.py --only lstm

From zoo models (edgerun/zoo, real weights where the zoo has them) exported with torch.onnx.export:
- lstm_dynamic: a 2-layer bidirectional LSTM, `quantize_dynamic` (DynamicQuantizeLSTM)
- minilm_dynamic: all-MiniLM-L6-v2, `quantize_dynamic` (DynamicQuantizeLinear + MatMulInteger)
- minilm_optimized: all-MiniLM-L6-v2 through `onnxruntime.transformers.optimizer` (EmbedLayerNormalization,
  Attention, SkipLayerNormalization, BiasGelu)
- minilm_optimized_dynamic: that optimized model, then `quantize_dynamic` (QAttention, DynamicQuantizeLinear)
- resnet18_static_qop: ResNet-18, `quantize_static` in QOperator form (QLinearConv, QLinearAdd,
  QLinearGlobalAveragePool, QGemm)
Each is imported once and run on edgerun's reference interpreter at two input sizes; the table gives the
largest difference from ONNX Runtime relative to the output's largest magnitude. Writes
bench/results/ort_made_models.json. Model files go to a temporary directory.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
RESULTS = os.path.join(ROOT, "bench", "results", "ort_made_models.json")


# ORT's quantizer needs each MatMul output's type; ONNX's shape inference leaves some unknown in exported
# transformers, and ORT's error message names this option as the remedy.
_DEFAULT_FLOAT = {"DefaultTensorType": 1}


def _export(module: Any, args: tuple[Any, ...], path: str, names: list[str], dynamic: dict[str, dict[int, str]]) -> None:
    import torch

    with torch.no_grad():
        torch.onnx.export(module, args, path, opset_version=17, dynamo=False, input_names=names,
                          dynamic_axes=dynamic)


def lstm(tmp: str) -> tuple[str, Callable[[int], dict[str, np.ndarray]]]:
    import torch
    from onnxruntime.quantization import quantize_dynamic

    torch.manual_seed(0)
    model = torch.nn.LSTM(24, 48, num_layers=2, bidirectional=True).eval()
    src, out = os.path.join(tmp, "lstm.onnx"), os.path.join(tmp, "lstm_q.onnx")
    _export(model, (torch.randn(10, 1, 24),), src, ["x"], {"x": {0: "seq"}})
    quantize_dynamic(src, out)
    return out, lambda n: {"x": np.random.default_rng(n).standard_normal((n, 1, 24)).astype(np.float32)}


def _minilm(tmp: str) -> tuple[str, Callable[[int], dict[str, np.ndarray]]]:
    from edgerun import zoo
    from edgerun.zoo.minilm import EXAMPLE_SENTENCES, tokenize

    src = os.path.join(tmp, "minilm.onnx")
    if not os.path.exists(src):
        entry = zoo.get("minilm_l6")
        names = ["input_ids", "attention_mask", "token_type_ids"]
        _export(entry.build().eval(), tuple(entry.example_inputs()), src, names,
                {n: {0: "batch", 1: "seq"} for n in names})

    def feeds(length: int) -> dict[str, np.ndarray]:
        ids, mask, types = (t.numpy() for t in tokenize(EXAMPLE_SENTENCES[:2], length))
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    return src, feeds


def minilm_dynamic(tmp: str) -> tuple[str, Callable[[int], dict[str, np.ndarray]]]:
    from onnxruntime.quantization import quantize_dynamic

    src, feeds = _minilm(tmp)
    out = os.path.join(tmp, "minilm_dq.onnx")
    quantize_dynamic(src, out, extra_options=_DEFAULT_FLOAT)
    return out, feeds


def minilm_optimized(tmp: str) -> tuple[str, Callable[[int], dict[str, np.ndarray]]]:
    from onnxruntime.transformers.optimizer import optimize_model

    src, feeds = _minilm(tmp)
    out = os.path.join(tmp, "minilm_opt.onnx")
    optimize_model(src, model_type="bert", num_heads=12, hidden_size=384).save_model_to_file(out)
    return out, feeds


def minilm_optimized_dynamic(tmp: str) -> tuple[str, Callable[[int], dict[str, np.ndarray]]]:
    from onnxruntime.quantization import quantize_dynamic

    src, feeds = minilm_optimized(tmp)
    out = os.path.join(tmp, "minilm_opt_dq.onnx")
    quantize_dynamic(src, out, extra_options=_DEFAULT_FLOAT)
    return out, feeds


def resnet18_static_qop(tmp: str) -> tuple[str, Callable[[int], dict[str, np.ndarray]]]:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    from edgerun import zoo

    src, out = os.path.join(tmp, "resnet18.onnx"), os.path.join(tmp, "resnet18_qop.onnx")
    entry = zoo.get("resnet18")
    _export(entry.build().eval(), tuple(entry.example_inputs()), src, ["x"], {"x": {0: "batch"}})

    def image(n: int) -> np.ndarray:
        return np.random.default_rng(n).standard_normal((n, 3, 224, 224)).astype(np.float32)

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.batches = iter([{"x": image(1)} for _ in range(4)])

        def get_next(self) -> dict[str, np.ndarray] | None:
            return next(self.batches, None)
    quantize_static(src, out, Reader(), quant_format=QuantFormat.QOperator)
    return out, lambda n: {"x": image(n)}


MODELS = {"lstm_dynamic": (lstm, (7, 19)), "minilm_dynamic": (minilm_dynamic, (16, 32)),
          "minilm_optimized": (minilm_optimized, (16, 32)),
          "minilm_optimized_dynamic": (minilm_optimized_dynamic, (16, 32)),
          "resnet18_static_qop": (resnet18_static_qop, (1, 2))}


def check(name: str, tmp: str) -> dict[str, Any]:
    import onnx
    import onnxruntime as ort

    from edgerun.frontends.onnx import from_onnx
    from edgerun.oracle import interpret

    make, sizes = MODELS[name]
    path, feeds = make(tmp)
    model = onnx.load(path)
    ops = collections.Counter(f"{n.domain + ':' if n.domain else ''}{n.op_type}" for n in model.graph.node)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    row: dict[str, Any] = {"model": name, "contrib_ops": sorted(o for o in ops if o.startswith("com.microsoft"))}
    errors = []
    for size in sizes:
        inputs = feeds(size)
        shapes = {k: v.shape for k, v in inputs.items()}
        start = time.perf_counter()
        program = from_onnx(path, input_shapes=shapes)
        row.setdefault("import_s", []).append(round(time.perf_counter() - start, 1))
        got = interpret(program.graph, [inputs[i.name] for i in model.graph.input if i.name in inputs])
        want = session.run(None, inputs)
        errors.append(max(float(np.abs(g.astype(np.float64) - w).max() / max(np.abs(w).max(), 1e-12))
                          for g, w in zip(got, want)))
    row["sizes"] = list(sizes)
    row["max_relative_error"] = [f"{e:.1e}" for e in errors]
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", help="comma-separated model names")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    names = args.only.split(",") if args.only else list(MODELS)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            rows.append(check(name, tmp))
            print(json.dumps(rows[-1]), flush=True)
    print("\n| model | ORT contrib ops | sizes | max error / max output | import s |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['model']} | {', '.join(o.split(':')[1] for o in r['contrib_ops']) or '-'} | {r['sizes']} | "
              f"{', '.join(r['max_relative_error'])} | {r['import_s']} |")
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open("/proc/loadavg") as f:
        load = f.read().split()[:3]
    print(f"load average at the end: {' '.join(load)}")
    with open(RESULTS, "w") as f:
        json.dump({"rows": rows, "loadavg": load}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
