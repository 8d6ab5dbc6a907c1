"""Unknown dimensions in ONNX's shapes never fail an import; two known, different sizes still do.

Includes a real model with real weights from a PyPI wheel: RapidOCR's text-direction classifier
(ch_ppocr_mobile_v2.0_cls_infer.onnx), whose graph output is declared (-1, 2) and whose input is (-1, 3, ?, ?).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from wheel_models import wheel_model

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx import from_onnx, import_onnx_graph
from edgerun.frontends.onnx.dims import disagreement
from edgerun.frontends.onnx.symbols import declare_inputs
from edgerun.oracle import interpret


def _model(nodes, inputs, outputs, value_info=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _declared(name, dims):
    """A value_info whose dims may be -1 or 0 (as converters write "unknown"), which make_tensor_value_info
    would also accept, written out explicitly so the test shows what the file holds."""
    vi = helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
    shape = vi.type.tensor_type.shape
    for d in dims:
        dim = shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        else:
            dim.dim_value = d
    return vi


def _dims(spec):
    return _declared("v", spec).type.tensor_type.shape.dim


@pytest.mark.parametrize("declared", [(-1, 2), (0, 2), ("unk__0", 2), ("?", 2), ("batch", 2)])
def test_identity_output_declared_unknown_imports(declared):
    """The text-direction classifier's failure, made small: Identity output declared (-1, 2)."""
    x = np.arange(4, dtype=np.float32).reshape(2, 2)
    m = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])],
               [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])], [_declared("y", declared)],
               [_declared("r", declared)])
    (got,) = interpret(import_onnx_graph(m), [x])
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def test_input_with_minus_one_is_dynamic_and_message_names_every_dimension():
    m = _model([helper.make_node("Identity", ["x"], ["y"])], [_declared("x", (-1, 3, "?", "?"))],
               [_declared("y", (-1, 3, "?", "?"))])
    assert set(from_onnx(m).graph.symbols) == {"x_0", "x_2", "x_3"}  # by default each imports as a symbol
    with pytest.raises(UnsupportedOpError) as err:
        from_onnx(m, unsized="refuse")
    text = str(err.value)
    assert "dimensions 0 (-1), 2 ('?'), 3 ('?') are dynamic" in text
    assert "input_shapes={'x': (<dim 0>, 3, <dim 2>, <dim 3>)}" in text
    x = np.ones((2, 3, 4, 5), dtype=np.float32)
    (got,) = interpret(import_onnx_graph(m, input_shapes={"x": x.shape}), [x])
    np.testing.assert_array_equal(got, x)


def test_stale_value_info_from_the_exporters_shapes_does_not_fail_a_pinned_import():
    """value_info declared (1, 2) by an export at batch 1; the input is (N, 2) and pinned to batch 3."""
    m = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Identity", ["r"], ["y"])],
               [_declared("x", ("N", 2))], [_declared("y", ("N", 2))], [_declared("r", (1, 2))])
    x = np.arange(-3, 3, dtype=np.float32).reshape(3, 2)
    (got,) = interpret(import_onnx_graph(m, input_shapes={"x": (3, 2)}), [x])
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def test_known_different_sizes_disagree():
    assert disagreement((2, 2), _dims((-1, 2)), {}) == ""
    assert disagreement((2, 2), _dims((0, "unk__1")), {}) == ""
    assert disagreement((2, 2), _dims((3, 2)), {}) == "dimension 0 is 2, ONNX infers 3"
    assert disagreement((2, 2), _dims((2, 2, 1)), {}) == "rank 2 against ONNX's rank 3"


def test_pinned_input_symbol_is_checked_other_symbols_are_not():
    inputs = [_declared("a", ("N", "?", 3)), _declared("b", ("N", "?"))]
    bindings = declare_inputs(inputs, {"a": (2, 7, 3), "b": (2, 9)}, set()).bindings
    assert bindings == {"N": 2}  # "?" is anonymous, and was pinned to 7 and 9 anyway
    assert disagreement((2, 5), _dims(("N", "M")), bindings) == ""
    assert "input_shapes gave as 2" in disagreement((4, 5), _dims(("N", "M")), bindings)


def _wheel_model(package: str, name: str) -> Path:
    return wheel_model(package, f"models/{name}")


def test_rapidocr_text_direction_classifier_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    path = _wheel_model("rapidocr_onnxruntime", "ch_ppocr_mobile_v2.0_cls_infer.onnx")
    declared = onnx.load(str(path), load_external_data=False).graph.output[0].type.tensor_type.shape.dim
    assert declared[0].dim_value == -1  # the declaration that used to fail the import
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in [(1, 3, 48, 192), (3, 3, 48, 96)]:
        x = rng.standard_normal(shape).astype(np.float32)
        program = from_onnx(str(path), input_shapes={"x": shape})
        (got,) = interpret(program.graph, [x])
        (want,) = session.run(None, {"x": x})
        assert got.shape == (shape[0], 2)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("name", "shapes"), [
    ("ch_PP-OCRv4_det_infer.onnx", [(1, 3, 64, 96), (1, 3, 96, 64)]),
    ("ch_PP-OCRv4_rec_infer.onnx", [(1, 3, 48, 80)]),
])
def test_rapidocr_detector_and_recognizer_at_several_sizes_match_onnxruntime(name, shapes):
    """Inputs ('p2o.DynamicDimension.0', 3, ?, ?): pinned per size, every import's checks pass."""
    ort = pytest.importorskip("onnxruntime")
    path = _wheel_model("rapidocr_onnxruntime", name)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for shape in shapes:
        x = rng.standard_normal(shape).astype(np.float32)
        (got,) = interpret(from_onnx(str(path), input_shapes={"x": shape}).graph, [x])
        (want,) = session.run(None, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
