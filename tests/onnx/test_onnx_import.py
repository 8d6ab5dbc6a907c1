"""The ONNX importer on hand-built models: opset variants, external data, dynamic shapes, bad files."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_graphs import make_model as _model
from onnx_graphs import value_info as _vi

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.onnx import OnnxModelError, from_onnx, import_onnx_graph
from edgerun.oracle import interpret


def _run(model, *arrays):
    return interpret(import_onnx_graph(model), list(arrays))


@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_sum_axes_as_attr_or_input(opset):
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    axes = numpy_helper.from_array(np.array([1], dtype=np.int64), "axes")
    node = helper.make_node("ReduceMean", ["x", "axes"] if opset >= 18 else ["x"], ["y"], keepdims=0,
                            **({} if opset >= 18 else {"axes": [1]}))
    m = _model([node], [_vi("x", [2, 3, 4])], [_vi("y", [2, 4])], [axes] if opset >= 18 else [], opset)
    np.testing.assert_allclose(_run(m, x)[0], x.mean(axis=1), rtol=1e-6)


@pytest.mark.parametrize("opset", [11, 13, 18])
def test_split_squeeze_unsqueeze_across_opsets(opset):
    x = np.arange(12, dtype=np.float32).reshape(1, 6, 2)
    inits, split_in, sq_in, unsq_in = [], ["x"], ["a"], ["b"]
    split_kw, sq_kw, unsq_kw = {}, {}, {}
    if opset >= 13:
        inits = [numpy_helper.from_array(np.array([2, 4], dtype=np.int64), "split"),
                 numpy_helper.from_array(np.array([0], dtype=np.int64), "ax0"),
                 numpy_helper.from_array(np.array([-1], dtype=np.int64), "axl")]
        split_in, sq_in, unsq_in = ["x", "split"], ["a", "ax0"], ["b", "axl"]
    else:
        split_kw, sq_kw, unsq_kw = {"split": [2, 4]}, {"axes": [0]}, {"axes": [-1]}
    nodes = [helper.make_node("Split", split_in, ["a", "b"], axis=1, **split_kw),
             helper.make_node("Squeeze", sq_in, ["y"], **sq_kw),
             helper.make_node("Unsqueeze", unsq_in, ["z"], **unsq_kw)]
    m = _model(nodes, [_vi("x", [1, 6, 2])], [_vi("y", [2, 2]), _vi("z", [1, 4, 2, 1])], inits, opset)
    y, z = _run(m, x)
    np.testing.assert_array_equal(y, x[0, :2])
    np.testing.assert_array_equal(z, x[:, 2:, :, None])


@pytest.mark.parametrize("opset", [13, 18])
def test_pad_with_and_without_axes(opset):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    inits = [numpy_helper.from_array(np.array([1, 2] if opset >= 18 else [0, 1, 0, 2], dtype=np.int64), "pads"),
             numpy_helper.from_array(np.array(-1.0, dtype=np.float32), "cv")]
    ins = ["x", "pads", "cv"]
    if opset >= 18:
        inits.append(numpy_helper.from_array(np.array([1], dtype=np.int64), "axes"))
        ins.append("axes")
    m = _model([helper.make_node("Pad", ins, ["y"], mode="constant")], [_vi("x", [2, 3])], [_vi("y", [2, 6])],
               inits, opset)
    np.testing.assert_array_equal(_run(m, x)[0], np.pad(x, ((0, 0), (1, 2)), constant_values=-1))


def test_resize_linear_matches_onnx_reference():
    from onnx.reference import ReferenceEvaluator
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 7)).astype(np.float32)
    scales = numpy_helper.from_array(np.array([1, 1, 1.6, 0.6], dtype=np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    m = _model([node], [_vi("x", [1, 2, 5, 7])], [_vi("y", [1, 2, 8, 4])], [scales], 19)
    want = ReferenceEvaluator(m).run(None, {"x": x})[0]
    np.testing.assert_allclose(_run(m, x)[0], want, rtol=1e-5, atol=1e-6)


def test_conv_auto_pad_and_shape_chain_fold():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 3, 7, 7)).astype(np.float32)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], auto_pad="SAME_UPPER", strides=[2, 2]),
             helper.make_node("Shape", ["c"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
             helper.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
             helper.make_node("Reshape", ["c", "shape"], ["y"])]
    inits = [numpy_helper.from_array(np.array(0, dtype=np.int64), "zero"),
             numpy_helper.from_array(np.array([0], dtype=np.int64), "zero1"),
             numpy_helper.from_array(np.array([-1], dtype=np.int64), "minus1"), w]
    m = _model(nodes, [_vi("x", [1, 3, 7, 7])], [_vi("y", [1, 64])], inits)
    import onnxruntime as ort
    want = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(_run(m, x)[0], want, rtol=1e-4, atol=1e-5)


def test_external_data_model_loads(tmp_path):
    w = np.random.default_rng(3).standard_normal((64, 64)).astype(np.float32)
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [2, 64])], [_vi("y", [2, 64])],
               [numpy_helper.from_array(w, "w")])
    path = tmp_path / "model.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert (tmp_path / "weights.bin").exists()
    x = np.ones((2, 64), dtype=np.float32)
    program = from_onnx(path)
    np.testing.assert_allclose(interpret(program.graph, [x])[0], x @ w, rtol=1e-5)
    (tmp_path / "weights.bin").unlink()
    with pytest.raises(OnnxModelError, match=r"external data file 'weights\.bin'.*missing"):
        from_onnx(path)


def test_dynamic_dimension_imports_as_a_symbol_refused_on_request_or_pinned():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", ["N", 4])], [_vi("y", ["N", 4])])
    assert from_onnx(m).graph.symbols == {"N": (1, 1 << 24)}
    with pytest.raises(UnsupportedOpError, match=r"dimension 0 is dynamic \('N'\).*input_shapes"):
        from_onnx(m, unsized="refuse")
    g = import_onnx_graph(m, input_shapes={"x": (3, 4)})
    assert g.specs[g.inputs[0]].shape == (3, 4)


def test_dynamic_shape_input_refused_clearly():
    m = _model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
               [_vi("x", [2, 3]), _vi("shape", [2], TensorProto.INT64)], [_vi("y", ["a", "b"])])
    with pytest.raises(UnsupportedOpError, match=r"'Reshape'.*dynamic shape input 'shape'"):
        import_onnx_graph(m)
    g = import_onnx_graph(m, constant_inputs={"shape": np.array([3, 2])})
    assert interpret(g, [np.ones((2, 3), np.float32)])[0].shape == (3, 2)


# ---- malformed files ---------------------------------------------------------------------------------

def _good():
    return _model([helper.make_node("Add", ["x", "b"], ["y"])], [_vi("x", [2])], [_vi("y", [2])],
                  [numpy_helper.from_array(np.ones(2, np.float32), "b")])


def test_truncated_protobuf(tmp_path):
    data = _good().SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(OnnxModelError, match=r"not a valid ONNX protobuf \(truncated"):
        from_onnx(path)


def test_not_onnx_at_all(tmp_path):
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\xff\xfe this is not protobuf \x00\x01" * 10)
    with pytest.raises(OnnxModelError):
        from_onnx(path)


def test_missing_file():
    with pytest.raises(OnnxModelError, match="does not exist"):
        from_onnx("/nonexistent/model.onnx")


def test_wrong_types():
    m = _model([helper.make_node("Add", ["x", "b"], ["y"])], [_vi("x", [2])], [_vi("y", [2])],
               [numpy_helper.from_array(np.ones(2, np.int64), "b")])
    with pytest.raises(EdgerunError, match="add needs inputs of one dtype"):
        from_onnx(m)


def test_missing_initializer():
    m = _model([helper.make_node("Add", ["x", "b"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(OnnxModelError, match=r"read undefined values \['b'\].*missing initializer"):
        from_onnx(m)


def test_cycle():
    nodes = [helper.make_node("Add", ["x", "c"], ["a"]), helper.make_node("Relu", ["a"], ["c"])]
    m = _model(nodes, [_vi("x", [2])], [_vi("c", [2])])
    with pytest.raises(OnnxModelError, match="cycle among nodes"):
        from_onnx(m)


def test_bad_opset():
    m = _good()
    m.opset_import[0].version = 999
    with pytest.raises(OnnxModelError, match="opset 999"):
        from_onnx(m)


def test_unknown_op_refused():
    m = _model([helper.make_node("NoSuchOp", ["x"], ["y"])], [_vi("x", [2])], [_vi("y", [2])])
    with pytest.raises(EdgerunError, match="NoSuchOp"):
        from_onnx(m)


def test_unsupported_dtype_refused():
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [2], TensorProto.COMPLEX64)],
               [_vi("y", [2], TensorProto.COMPLEX64)])
    with pytest.raises(UnsupportedOpError, match="COMPLEX64"):
        from_onnx(m)


def test_backend_runs_through_onnx_api():
    from edgerun.frontends.onnx import backend
    m = _good()
    assert backend.supports_device("CPU")
    (y,) = backend.prepare(m).run([np.array([1, 2], np.float32)])
    np.testing.assert_array_equal(y, [2, 3])


def test_external_data_outside_the_model_folder_refused(tmp_path):
    w = numpy_helper.from_array(np.ones((4, 4), np.float32), "w")
    w.ClearField("float_data")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    w.external_data.add(key="location", value="../outside.bin")
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_vi("x", [1, 4])], [_vi("y", [1, 4])], [w])
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "model.onnx"
    path.write_bytes(m.SerializeToString())
    (tmp_path / "outside.bin").write_bytes(np.ones(16, np.float32).tobytes())
    with pytest.raises(OnnxModelError, match="outside the model's folder"):
        from_onnx(path)


def _branch(value):
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [2])
    node = helper.make_node("Mul", ["x", "k"], ["out"])
    k = numpy_helper.from_array(np.full(2, value, np.float32), "k")
    return helper.make_graph([node], f"b{value}", [], [out], initializer=[k])


def test_if_on_constant_condition_is_inlined():
    cond = numpy_helper.from_array(np.array(False), "cond")
    node = helper.make_node("If", ["cond"], ["y"], then_branch=_branch(2.0), else_branch=_branch(3.0))
    m = _model([node], [_vi("x", [2])], [_vi("y", [2])], [cond])
    graph = import_onnx_graph(m)
    assert [n.op for n in graph.nodes] == ["mul"]  # only the else branch, no select
    np.testing.assert_array_equal(interpret(graph, [np.array([1, 2], np.float32)])[0], [3, 6])


@pytest.mark.parametrize("opset", [10, 13, 19])
def test_resize_inputs_across_opsets(opset):
    import onnxruntime as ort
    x = np.random.default_rng(4).standard_normal((1, 1, 3, 4)).astype(np.float32)
    scales = numpy_helper.from_array(np.array([1, 1, 2, 1.5], dtype=np.float32), "scales")
    roi = numpy_helper.from_array(np.array([], dtype=np.float32), "roi")
    ins = ["x", "scales"] if opset == 10 else ["x", "roi", "scales"]
    node = helper.make_node("Resize", ins, ["y"], mode="nearest")
    m = _model([node], [_vi("x", [1, 1, 3, 4])], [_vi("y", [1, 1, 6, 6])], [scales] if opset == 10 else [roi, scales],
               opset)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(_run(m, x)[0], sess.run(None, {"x": x})[0])
