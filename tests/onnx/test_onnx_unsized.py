"""Import with no shape arguments (the default): dynamic dimensions become symbols of any size; a model that
holds only on multiples has the multiple inferred; what the import cannot prove for every size is a guard in
the one program file, checked at each new size, and a size that fails it is refused at that call with the
reason. Real models from PyPI wheels (bench/unsized_wheel_models.py runs thirteen) and small hand-written ones,
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
from edgerun.frontends.onnx import from_onnx
from edgerun.ir.specialize import guards
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
        from_onnx(model_bytes, unsized="refuse")  # on request, every size must be stated
    program = from_onnx(model_bytes)
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


def test_what_holds_only_at_some_sizes_is_a_guard_in_one_program_file(tmp_path: Path) -> None:
    """No one plan serves every L, but one program does: the Reshape is a guard, checked at each new size. The
    saved file runs at new sizes through the runtime alone (no ONNX import at run time); a size that fails
    the guard is refused at its call, naming the node and both counts. PP-OCRv4's recognizer takes this path
    (bench/unsized_wheel_models.py)."""
    model_bytes = _reshape_by_height()
    program = from_onnx(model_bytes)
    assert [origin for origin, _, _ in guards(program.graph)] == ["ONNX node 'r' (Reshape)"]
    program.save(tmp_path / "m.edgerun")
    assert "onnx_model" not in Program.read(tmp_path / "m.edgerun").graph.constants  # IR, not the ONNX bytes
    model = edgerun.load(str(tmp_path / "m.edgerun"))
    rng = np.random.default_rng(2)
    for shape in ((2, 40), (1, 80), (2, 40)):
        _matches_ort(model_bytes, model, {"x": rng.standard_normal(shape).astype(np.float32)})
    assert model.specializations_made == 2  # the third call reused the first size's specialisation
    with pytest.raises(EdgerunError, match=r"cannot run at these sizes \(L=96, N=1\): ONNX node 'r' \(Reshape\) "
                                           r"needs L\*N = .*here 96 against 192"):
        model(np.zeros((1, 96), np.float32))
    # Given sizes, the relation is proved at import: no guard, one plan for the bounds, checked upfront. Bounds
    # under which (L + 15)//48 is always 1 prove it too (the import uses the bounds); bounds past them cannot
    # be served by one plan and are refused at import, in one line.
    bounded = from_onnx(model_bytes, input_shapes={"x": (("N", 1, 4), 48)})
    assert bounded.graph.symbols == {"N": (1, 4)} and not guards(bounded.graph)
    bounded = from_onnx(model_bytes, input_shapes={"x": (("N", 1, 4), ("L", 33, 80))})
    assert bounded.graph.symbols == {"N": (1, 4), "L": (33, 80)} and not guards(bounded.graph)
    model = edgerun.load(bounded)
    for shape in ((2, 33), (1, 80)):
        _matches_ort(model_bytes, model, {"x": rng.standard_normal(shape).astype(np.float32)})
    with pytest.raises(EdgerunError, match=r"cannot reshape .* no one plan serves them") as refused:
        from_onnx(model_bytes, input_shapes={"x": (("N", 1, 4), ("L", 33, 96))})
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("package, relative, sizes, bounds", [
    ("rapidocr", "models/ch_ppocr_mobile_v2.0_cls_mobile.onnx", [{"x": (1, 3, 48, 192)}, {"x": (3, 3, 48, 96)}],
     {"x": (("B", 1, 4), 3, 48, ("W", 32, 256))}),
    ("faster_whisper", "assets/silero_vad_v6.onnx",
     [{"input": (4, 576), "h": (1, 1, 128), "c": (1, 1, 128)}, {"input": (9, 576), "h": (1, 1, 128), "c": (1, 1, 128)}],
     {"input": (("B", 1, 16), 576)}),
])
def test_wheel_models_import_with_no_shape_arguments(package: str, relative: str, sizes: list[dict[str, tuple[int, ...]]],
                                                     bounds: dict[str, tuple[object, ...]]) -> None:
    path = str(wheel_model(package, relative))
    program = from_onnx(path)
    assert program.graph.symbols and not guards(program.graph)
    model = edgerun.load(program)
    rng = np.random.default_rng(3)
    for size in sizes:
        _matches_ort(path, model, {k: (rng.standard_normal(v) * 0.5).astype(np.float32) for k, v in size.items()})
    assert onnx.load(path, load_external_data=False).graph.input  # the file itself was not rewritten
    # The same model with bounds given: one template for every size in them, checked upfront, no guard.
    bounded = from_onnx(path, input_shapes=bounds)  # type: ignore[arg-type]
    declared = {d[0]: (d[1], d[2]) for shape in bounds.values() for d in shape if isinstance(d, tuple)}
    assert bounded.graph.symbols == declared and not guards(bounded.graph)
    model = edgerun.load(bounded)
    for size in sizes:
        _matches_ort(path, model, {k: (rng.standard_normal(v) * 0.5).astype(np.float32) for k, v in size.items()})


def _anchor_grid() -> bytes:
    """x [N, 2, H, W] + arange(float(W)): a detector's anchor row, a Range up to a size cast to float."""
    consts = [numpy_helper.from_array(np.array(v, dt), n) for n, v, dt in
              (("three", 3, np.int64), ("zero", 0.0, np.float32), ("one", 1.0, np.float32))]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "three"], ["w"], axis=0),
             helper.make_node("Cast", ["w"], ["wf"], to=TensorProto.FLOAT),
             helper.make_node("Range", ["zero", "wf", "one"], ["r"]),
             helper.make_node("Add", ["x", "r"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, "H", "W"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2, "H", "W"])], consts)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString()


def test_a_range_up_to_a_size_cast_to_float_stays_symbolic() -> None:
    """YOLOv8's anchors (bench/unsized_wheel_models.py: nudenet) are such a Range: one template, no guard."""
    model_bytes = _anchor_grid()
    program = from_onnx(model_bytes)
    assert set(program.graph.symbols) == {"N", "H", "W"} and not guards(program.graph)
    model = edgerun.load(program)
    rng = np.random.default_rng(5)
    for shape in ((1, 2, 3, 5), (2, 2, 4, 9)):
        _matches_ort(model_bytes, model, {"x": rng.standard_normal(shape).astype(np.float32)})


def test_a_size_the_model_cannot_run_at_is_refused_at_its_call_as_onnxruntime_refuses_it(tmp_path: Path) -> None:
    """silero-vad's op15 export squeezes a frame count in a branch taken where it is 1, and its LSTM needs that
    branch's rank: the squeeze is a guard, the other branch left out. At 1088 samples the count is 2; ONNX
    Runtime refuses that size too (its LSTM gets a rank-5 input)."""
    path = str(wheel_model("silero_vad", "data/silero_vad_16k_op15.onnx"))
    sr = {"sr": np.array(16000)}
    program = from_onnx(path, constant_inputs=sr)
    program.save(tmp_path / "vad.edgerun")
    model = edgerun.load(str(tmp_path / "vad.edgerun"))
    rng = np.random.default_rng(4)
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x, state = (rng.standard_normal((batch, 576)) * 0.3).astype(np.float32), np.zeros((2, batch, 128), np.float32)
        want = session.run(None, {"input": x, "state": state, **sr})
        for g, w in zip(model(input=x, state=state), want):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    bad = {"input": np.zeros((2, 1088), np.float32), "state": np.zeros((2, 2, 128), np.float32)}
    with pytest.raises(EdgerunError, match=r"cannot run at these sizes \(batch=2, sequence=1088\): ONNX node "
                                           r"'/model/decoder/Squeeze' \(Squeeze\)"):
        model(**bad)
    with pytest.raises(Exception, match="Input X must have 3 dimensions"):
        session.run(None, {**bad, **sr})
