"""Why the MNN backend claims no quantized op: MNN 3.6.1 cannot run an ONNX QDQ program's integer layers.

MNN's documented int8 routes are its offline quantizer (`_tools.mnnquant`, which aborts here with
std::length_error even on a two-conv model: bench/quant_speed.py reports it), weight-only int8 storage
(`--weightQuantBits 8`, computed in float: not the program's integer arithmetic) and converting an ONNX QDQ
model. The last is the only one that could run an edgerun int8 program's convs as they are; this test
converts the smallest such program through the backend's own converter process and finds MNN computing no
output, while the same convs without the activation quantize/dequantize pair run. When it starts passing
the other way, MNN can take int8 partitions (docs/quantization.md, "MNN").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("MNN", reason="MNN is not installed (pip install edgerun[mnn])")
onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime", reason="the MNN backend emits ONNX with the onnxruntime package's emitter")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from small_cnn import small_cnn  # noqa: E402

import edgerun  # noqa: E402
from edgerun.backends.mnn import MnnBackend, convert_model  # noqa: E402
from edgerun.ir.registry import get_op  # noqa: E402


def _two_convs(qdq_between: bool) -> onnx.ModelProto:
    """x -> conv(int8 per-channel weights, dequantized) -> relu -> [uint8 Q/DQ] -> conv(int8 weights) -> y."""
    rng = np.random.default_rng(0)
    inits, nodes = [], []
    act = "x"
    for i, (cin, cout) in enumerate([(8, 16), (16, 8)]):
        w = rng.integers(-64, 65, (cout, cin, 3, 3)).astype(np.int8)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.full(cout, 0.01, np.float32), f"ws{i}"),
                  numpy_helper.from_array(np.zeros(cout, np.int8), f"wz{i}")]
        nodes.append(helper.make_node("DequantizeLinear", [f"w{i}", f"ws{i}", f"wz{i}"], [f"wf{i}"], axis=0))
        nodes.append(helper.make_node("Conv", [act, f"wf{i}"], [f"c{i}"], pads=[1, 1, 1, 1]))
        act = f"c{i}"
        if i == 0:
            nodes.append(helper.make_node("Relu", [act], ["r"]))
            act = "r"
            if qdq_between:
                inits += [numpy_helper.from_array(np.array(0.05, np.float32), "rs"),
                          numpy_helper.from_array(np.array(0, np.uint8), "rz")]
                nodes += [helper.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"]),
                          helper.make_node("DequantizeLinear", ["rq", "rs", "rz"], ["rd"])]
                act = "rd"
    nodes.append(helper.make_node("Identity", [act], ["y"]))
    graph = helper.make_graph(nodes, "two_convs", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def _run_mnn(path: Path, x: np.ndarray) -> np.ndarray:
    import MNN

    interpreter = MNN.Interpreter(str(path))
    session = interpreter.createSession({"numThread": 1, "precision": "high"})
    interpreter.getSessionInput(session).copyFrom(
        MNN.Tensor(x.shape, MNN.Halide_Type_Float, x, MNN.Tensor_DimensionType_Caffe))
    interpreter.runSession(session)
    out = interpreter.getSessionOutput(session)
    host = MNN.Tensor(out.getShape(), MNN.Halide_Type_Float, np.zeros(out.getShape(), np.float32),
                      MNN.Tensor_DimensionType_Caffe)
    out.copyToHostTensor(host)
    return np.array(host.getData(), np.float32).reshape(out.getShape())


def test_mnn_runs_int8_weights_but_not_a_quantized_activation(tmp_path: Path) -> None:
    import onnxruntime as ort

    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    results = {}
    for qdq in (False, True):
        folder = tmp_path / f"qdq{int(qdq)}"
        folder.mkdir()
        model = _two_convs(qdq)
        convert_model(model, {}, folder / "partition.mnn")
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        results[qdq] = (_run_mnn(folder / "partition.mnn", x), want)
    got, want = results[False]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
    got, want = results[True]
    # MNN 3.6.1's converter reads the quantized activation as [16, 1, 16, 16] ("Error for compute convolution
    # shape ... Input data channel may be mismatch with filter channel count") and the session computes nothing.
    assert got.shape != want.shape, "MNN now runs ONNX QDQ activations: let the MNN backend claim int8 convs"


def test_the_mnn_backend_claims_no_quantized_op() -> None:
    q = edgerun.quantize(small_cnn(), "int8-static",
                         calibration={"image": np.random.default_rng(2).standard_normal((2, 4, 3, 16, 16)).astype(np.float32)})
    mnn = MnnBackend(threads=1)
    quant_nodes = [n for n in q.graph.nodes if get_op(n.op).family == "quant"]
    assert {n.op for n in quant_nodes} >= {"quantize_linear", "conv_integer", "requantize"}
    assert not [n.op for n in quant_nodes if mnn.supports(n, q.graph)]
