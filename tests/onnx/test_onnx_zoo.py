"""Zoo models exported with torch.onnx.export (TorchScript exporter, opset 17), imported, match torch eager
and the torch-export path within 1e-4 relative."""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
zoo = pytest.importorskip("edgerun.zoo")

from edgerun.frontends.onnx import from_onnx  # noqa: E402
from edgerun.frontends.torch import export  # noqa: E402
from edgerun.oracle import interpret  # noqa: E402

# MiniLM, the CNNs with distinct blocks (plain, fire, depthwise) and two small models; resnet50 and
# shufflenet_v2 add time but no new ops, and run in `bench/onnx_conformance.py --zoo`.
MODELS = ["mlp", "llama_small", "squeezenet1_1", "resnet18", "mobilenet_v2", "minilm_l6"]


def _first(out):
    return out[0] if isinstance(out, tuple | list) else out


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_through_onnx_matches_torch(name):
    entry = zoo.get(name)
    module = entry.build().eval()
    args = tuple(entry.example_inputs())
    buf = io.BytesIO()
    # The dynamo exporter needs onnxscript, which is not a dependency; the TorchScript one is enough here.
    torch.onnx.export(module, args, buf, opset_version=17, dynamo=False)
    program = from_onnx(buf.getvalue())
    arrays = [a.numpy() for a in args]
    got = interpret(program.graph, arrays)[0]
    with torch.no_grad():
        eager = _first(module(*args)).numpy()
    via_export = interpret(export(module, args).graph, arrays)[0]
    assert got.shape == eager.shape and got.dtype == eager.dtype
    assert _rel(got, eager) <= 1e-4
    assert _rel(got, via_export) <= 1e-4
