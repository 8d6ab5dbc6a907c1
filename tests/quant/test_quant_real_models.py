"""A real int8 ONNX model from a PyPI wheel against ONNX Runtime: ddddocr's captcha reader (common_old.onnx),
quantized with ONNX Runtime's dynamic quantization (DynamicQuantizeLinear + ConvInteger + MatMulInteger).

The model's recurrent middle is ONNX Runtime's contrib DynamicQuantizeLSTM, which edgerun does not import,
so the test takes the two quantized halves around it: the 21-layer ConvInteger CNN and the MatMulInteger
classifier head.
"""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from edgerun.frontends.onnx import from_onnx  # noqa: E402
from edgerun.oracle import interpret  # noqa: E402


def _model_path() -> str:
    spec = importlib.util.find_spec("ddddocr")  # located, never imported: it pulls in OpenCV
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("ddddocr is not installed (scripts/setup.sh installs it with --no-deps)")
    return os.path.join(next(iter(spec.submodule_search_locations)), "common_old.onnx")


@pytest.fixture(scope="module")
def captcha_model():  # type: ignore[no-untyped-def]
    from onnx.utils import Extractor
    model = onnx.load(_model_path())
    for d in model.graph.input[0].type.tensor_type.shape.dim:
        if d.dim_param:
            d.dim_value = 96  # the image width is symbolic; pin it
    model = onnx.shape_inference.infer_shapes(model)
    extractor = Extractor(model)
    cnn, head = extractor.extract_model(["input1"], ["227"]), extractor.extract_model(["366"], ["387"])
    # The head's input is the LSTM's output on a real-looking image, from the whole model on ONNX Runtime.
    lstm_out = _ort_values(model, {"input1": _captcha_like(96)})["366"]
    del head.graph.input[0].type.tensor_type.shape.dim[:]
    head.graph.input[0].type.tensor_type.shape.dim.extend(
        onnx.TensorShapeProto.Dimension(dim_value=d) for d in lstm_out.shape)
    # The model declares its output as (1, 'seqlen'), but its last Reshape makes a rank-3 value (ONNX Runtime
    # only warns); the import checks declared shapes, so the extracted head declares three free dimensions instead.
    out_dims = head.graph.output[0].type.tensor_type.shape.dim
    del out_dims[:]
    out_dims.extend(onnx.TensorShapeProto.Dimension(dim_param=p) for p in ("steps", "batch", "classes"))
    return cnn, head, lstm_out


def _ort_values(model, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:  # type: ignore[no-untyped-def]
    """Every intermediate value of the model on ONNX Runtime."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = [o for n in m.graph.node for o in n.output if o]
    del m.graph.output[:]
    m.graph.output.extend(onnx.ValueInfoProto(name=n) for n in names)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip(names, sess.run(None, feed)))


def _typed(name: str, arr: np.ndarray):  # type: ignore[no-untyped-def]
    return onnx.helper.make_tensor_value_info(name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape))


def _captcha_like(width: int) -> np.ndarray:
    """A grey image with dark strokes, normalised as ddddocr does ((pixel / 255 - 0.5) / 0.5)."""
    rng = np.random.default_rng(0)
    img = np.full((64, width), 220.0) + rng.normal(0, 12, (64, width))
    for c in range(5):  # five glyph-like blobs of strokes
        x0 = 8 + c * (width - 16) // 5
        for _ in range(6):
            r, col = rng.integers(12, 52), x0 + rng.integers(0, 12)
            img[r - 2:r + 2, col:col + 6] = 40
            img[12:52, col] = 50
    return (((np.clip(img, 0, 255) / 255.0) - 0.5) / 0.5).astype(np.float32)[None, None]


def test_captcha_cnn_integer_layers_are_bit_exact_and_the_output_matches(captcha_model) -> None:  # type: ignore[no-untyped-def]
    cnn, _, _ = captcha_model
    program = from_onnx(cnn)
    assert program.graph.op_counts()["conv_integer"] == 21
    x = _captcha_like(96)
    ref = _ort_values(cnn, {"input1": x})
    ref["input1"] = x
    # Each integer layer on ONNX Runtime's own quantized inputs: bit-exact.
    checked = 0
    for node in cnn.graph.node:
        if node.op_type in ("ConvInteger", "DynamicQuantizeLinear"):
            single = onnx.helper.make_model(onnx.helper.make_graph(
                [node], "one", [_typed(i, ref[i]) for i in node.input if i and i in ref],
                [_typed(o, ref[o]) for o in node.output]), opset_imports=cnn.opset_import)
            single.graph.initializer.extend(i for i in cnn.graph.initializer if i.name in node.input)
            feed = {i: ref[i] for i in node.input if i in ref}
            outs = interpret(from_onnx(single).graph, feed)
            for name, got in zip(node.output, outs):
                np.testing.assert_array_equal(got, ref[name], err_msg=f"{node.op_type} {node.name}")
            checked += 1
    assert checked == 42
    # The whole CNN: ONNX Runtime's sigmoid is an ulp off the correctly rounded one, which can flip a later
    # dynamic quantization step; the features still agree closely.
    got = interpret(program.graph, [x])[0]
    want = ref["227"]
    cos = float(np.sum(got * want) / np.linalg.norm(got) / np.linalg.norm(want))
    assert cos > 0.999 and np.abs(got - want).max() <= 0.03 * np.abs(want).max()


def test_captcha_classifier_head_matches(captcha_model) -> None:  # type: ignore[no-untyped-def]
    _, head, h = captcha_model
    program = from_onnx(head)
    assert {"dynamic_quantize", "matmul_integer"} <= set(program.graph.op_counts())
    want = ort.InferenceSession(head.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"366": h})[0]
    got = interpret(program.graph, [h])[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_onnxruntime_quantize_static_qdq_model_matches_onnxruntime(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # ONNX Runtime's own static quantizer on a conv + relu + gemm model: its QDQ output imports as
    # quantize_linear / dequantize_linear around float ops, and agrees with ORT's fused int8 kernels to
    # within a few quantization steps of the output (ORT requantizes in float32 and rounds the bias).
    from onnx import TensorProto, helper, numpy_helper
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((8, 3, 3, 3)).astype(np.float32) * 0.3, "w"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32) * 0.1, "b"),
             numpy_helper.from_array(rng.standard_normal((8 * 6 * 6, 5)).astype(np.float32) * 0.05, "fc"),
             numpy_helper.from_array(np.array([1, 8 * 6 * 6], np.int64), "flat")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Reshape", ["r", "flat"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], inits)
    float_path, int8_path = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), float_path)
    samples = [rng.standard_normal((1, 3, 12, 12)).astype(np.float32) for _ in range(8)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{"x": s} for s in samples])

        def get_next(self):  # type: ignore[no-untyped-def]
            return next(self.items, None)
    quantize_static(str(float_path), str(int8_path), Reader(), quant_format=QuantFormat.QDQ, per_channel=True)
    program = from_onnx(str(int8_path))
    assert {"quantize_linear", "dequantize_linear"} <= set(program.graph.op_counts())
    x = rng.standard_normal((1, 3, 12, 12)).astype(np.float32)
    want = ort.InferenceSession(str(int8_path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = interpret(program.graph, [x])[0]
    qmodel = onnx.load(str(int8_path))
    last = next(n for n in qmodel.graph.node if "y" in n.output)  # the output's DequantizeLinear
    step = float(next(numpy_helper.to_array(i) for i in qmodel.graph.initializer if i.name == last.input[1]))
    assert np.abs(got - want).max() <= 2.01 * step  # at most two output steps apart
    assert np.isclose(got, want, atol=1e-6).mean() >= 0.4
