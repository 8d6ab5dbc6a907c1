"""Import with no shape arguments (`unsized="symbols"`): dynamic dimensions become symbols of any size; a model
that holds only on multiples has the multiple inferred; one that cannot be planned for every size at once is
imported per size at its first call, and a size it cannot run at is refused at that call with the reason.
Real models from PyPI wheels (bench/unsized_wheel_models.py runs thirteen) and small hand-written ones,
against ONNX Runtime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from wheel_models import wheel_model

import edgerun
from edgerun.errors import EdgerunError
from edgerun.frontends.onnx import ShapeTemplate, from_onnx
from edgerun.program import Program

ort = pytest.importorskip("onnxruntime")


def _matches_ort(path_or_model: str | bytes, model: object, feeds: dict[str, np.ndarray], atol: float = 1e-5) -> None:
    session = ort.InferenceSession(path_or_model, providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    got = model(**feeds)  # type: ignore[operator]
    got = list(got) if isinstance(got, tuple | list) else [got]
    for g, w in zip(got, want):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=atol)


def _halve_and_double() -> bytes:
    """x [N, 4, H, W] -> x + upsample(maxpool(conv(x))): the add lines up only when H and W are even."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4, 3, 3)).astype(np.float32) * 0.2, "w")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Resize", ["p", "", "scales"], ["u"], mode="nearest",
                              coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
             helper.make_node("Add", ["x", "u"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "H", "W"])], [w, scales])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_dimensions_nobody_sized_import_as_symbols_and_run_at_each_size() -> None:
    model_bytes = _halve_and_double()
    with pytest.raises(EdgerunError, match="dynamic"):
        from_onnx(model_bytes)  # the default still asks for sizes or bounds
    program = from_onnx(model_bytes, unsized="symbols")
    # The add holds only on even sizes: the importer found the multiple itself.
    assert program.graph.symbols == {"N": (1, 1 << 24), "H_div2": (1, 1 << 23), "W_div2": (1, 1 << 23)}
    model = edgerun.load(program)
    rng = np.random.default_rng(1)
    for shape in ((1, 4, 6, 8), (2, 4, 10, 4)):
        _matches_ort(model_bytes, model, {"x": rng.standard_normal(shape).astype(np.float32)})
    with pytest.raises(EdgerunError, match="dimension 2 is 7: the program needs a multiple of 2"):
        model(np.zeros((1, 4, 7, 8), np.float32))


def test_bounds_still_give_one_plan() -> None:
    program = from_onnx(_halve_and_double(), input_shapes={"x": (1, 4, ("H", 2, 64, 2), ("W", 2, 64, 2))})
    assert program.graph.symbols == {"H_div2": (1, 32), "W_div2": (1, 32)}


def _reshape_by_height() -> bytes:
    """x [N, L] reshaped to [N, (L + 15) // 48, L], then Relu: as PP-OCRv4's recognizer does with its image
    height, the element count works out only while (L + 15) // 48 is 1, for L in 33..80."""
    consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
              (("zero", [0]), ("one", [1]), ("c15", [15]), ("c48", [48]))]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Gather", ["s", "one"], ["l"], axis=0),
             helper.make_node("Add", ["l", "c15"], ["a"]),
             helper.make_node("Div", ["a", "c48"], ["q"]),
             helper.make_node("Concat", ["n", "q", "l"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("Relu", ["r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", "L"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", "Q", "L"])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_model_not_plannable_for_every_size_is_imported_per_size(tmp_path: Path) -> None:
    """No one program serves every L: each new size is imported at its first call (cached), and a size the
    model cannot run at is refused at that call, naming the sizes and the reason. bench/unsized_wheel_models.py
    shows PP-OCRv4's recognizer taking this path."""
    model_bytes = _reshape_by_height()
    program = from_onnx(model_bytes, unsized="symbols")
    assert isinstance(program, ShapeTemplate) and "Reshape" in program.reason
    program.save(tmp_path / "m.edgerun")
    # The saved file holds the ONNX model; the frontend opens it (the runtime needs numpy alone).
    model = edgerun.load(ShapeTemplate.from_program(Program.read(tmp_path / "m.edgerun")))
    with pytest.raises(EdgerunError, match="imported per input size"):
        edgerun.load(str(tmp_path / "m.edgerun"))
    rng = np.random.default_rng(2)
    for shape in ((2, 40), (1, 80), (2, 40)):
        _matches_ort(model_bytes, model, {"x": rng.standard_normal(shape).astype(np.float32)})
    assert model.specializations_made == 2  # the third call reused the first size's program
    with pytest.raises(EdgerunError, match=r"cannot run at these input sizes \(x \(1, 96\)\)"):
        model(np.zeros((1, 96), np.float32))


@pytest.mark.parametrize("package, relative, sizes", [
    ("rapidocr", "models/ch_ppocr_mobile_v2.0_cls_mobile.onnx", [{"x": (1, 3, 48, 192)}, {"x": (3, 3, 48, 96)}]),
    ("faster_whisper", "assets/silero_vad_v6.onnx",
     [{"input": (4, 576), "h": (1, 1, 128), "c": (1, 1, 128)}, {"input": (9, 576), "h": (1, 1, 128), "c": (1, 1, 128)}]),
])
def test_wheel_models_import_with_no_shape_arguments(package: str, relative: str,
                                                     sizes: list[dict[str, tuple[int, ...]]]) -> None:
    path = str(wheel_model(package, relative))
    program = from_onnx(path, unsized="symbols")
    assert program.graph.symbols and not isinstance(program, ShapeTemplate)
    model = edgerun.load(program)
    rng = np.random.default_rng(3)
    for size in sizes:
        _matches_ort(path, model, {k: (rng.standard_normal(v) * 0.5).astype(np.float32) for k, v in size.items()})
    assert onnx.load(path, load_external_data=False).graph.input  # the file itself was not rewritten


def test_a_size_the_model_cannot_run_at_is_refused_at_its_call_as_onnxruntime_refuses_it() -> None:
    """silero-vad's op15 export runs its LSTM in a branch whose input rank depends on the chunk length: it is
    imported per size; at 1088 samples the LSTM would get a rank-5 input, which ONNX Runtime refuses too."""
    path = str(wheel_model("silero_vad", "data/silero_vad_16k_op15.onnx"))
    sr = {"sr": np.array(16000)}
    program = from_onnx(path, constant_inputs=sr, unsized="symbols")
    assert isinstance(program, ShapeTemplate)
    model = edgerun.load(program)
    x, state = (np.random.default_rng(4).standard_normal((1, 576)) * 0.3).astype(np.float32), np.zeros((2, 1, 128),
                                                                                                     np.float32)
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x, "state": state, **sr})
    for g, w in zip(model(input=x, state=state), want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    bad = {"input": np.zeros((2, 1088), np.float32), "state": np.zeros((2, 2, 128), np.float32)}
    with pytest.raises(EdgerunError, match=r"cannot run at these input sizes.*LSTM input X must have 3 dimensions"):
        model(**bad)
    with pytest.raises(Exception, match="Input X must have 3 dimensions"):
        ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {**bad, **sr})
