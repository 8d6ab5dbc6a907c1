"""Value-deciding inputs: an ONNX model that feeds reduction axes, Resize scales or a Reshape target as graph
inputs is imported once and specialised per value at call time (frontends/onnx/value_template.py), checked
against ONNX Runtime at several values, with the cache keyed on the values."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import edgerun
from edgerun.errors import EdgerunError
from edgerun.frontends.onnx import ValueTemplate, from_onnx
from edgerun.frontends.onnx.backend import EdgerunBackend
from edgerun.frontends.onnx.conformance import edgerun_runner, node_cases, run_case, symbolic_runner
from edgerun.ir.specialize import MAX_VALUE_ELEMENTS, ValueBindingError
from edgerun.program import Program


def _model(nodes, inputs, outputs, opset=18):
    graph = helper.make_graph(nodes, "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _ort(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _reduce_sum_model():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)
    return _model([node], [_vi("x", [2, 3, 4]), _vi("axes", [1], TensorProto.INT64)], [_vi("y", ["a", "b", "c"])])


def test_reduce_sum_with_axes_as_input_specialises_per_axes_value():
    model = _reduce_sum_model()
    program = from_onnx(model)
    assert isinstance(program, ValueTemplate) and program.value_inputs == ["axes"]
    m = edgerun.load(program)
    assert m.value_inputs == ["axes"] and m.output_names == ["y"]
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    for axes in ([2], [0], [2], [-2], [0]):
        a = np.array(axes, np.int64)
        (want,) = _ort(model, {"x": x, "axes": a})
        got = m(x, a)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # One import and one load per distinct value: a repeated value reuses its specialisation, a new one never
    # does (axes=[0] after axes=[2] got its own), so no call ran with another value's structure.
    assert program.imports_made == 3 and m.specializations_made == 3


def test_auto_places_each_value_specialisation():
    model = _reduce_sum_model()
    m = edgerun.load(from_onnx(model), backends="auto")
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    for axes in ([1], [0]):
        a = np.array(axes, np.int64)
        (want,) = _ort(model, {"x": x, "axes": a})
        np.testing.assert_allclose(m(x, a), want, rtol=1e-5, atol=1e-6)
    assert m.specializations_made == 2


def test_a_cached_specialisation_is_never_reused_for_other_values_of_the_same_shape():
    model = _reduce_sum_model()
    m = edgerun.load(from_onnx(model))
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    first = m(x, np.array([1], np.int64))
    second = m(x, np.array([2], np.int64))
    assert first.shape == (2, 1, 4) and second.shape == (2, 3, 1)
    np.testing.assert_array_equal(first, x.sum(axis=1, keepdims=True))
    np.testing.assert_array_equal(second, x.sum(axis=2, keepdims=True))
    # Same bytes, other dtype: ONNX axes are int64, an int32 array is refused rather than keyed apart silently.
    with pytest.raises(EdgerunError, match=r"input 'axes' is int32\[1\], the program takes int64\[1\]"):
        m(x, np.array([1], np.int32))


def test_resize_with_a_scales_input_at_two_scales():
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    model = _model([node], [_vi("x", [1, 2, 3, 4]), _vi("scales", [4])], [_vi("y", ["n", "c", "h", "w"])])
    m = edgerun.load(from_onnx(model))
    x = np.random.default_rng(1).standard_normal((1, 2, 3, 4)).astype(np.float32)
    for scales in ([1, 1, 2, 2], [1, 1, 0.5, 1.5], [1, 1, 2, 2]):
        s = np.array(scales, np.float32)
        (want,) = _ort(model, {"x": x, "scales": s})
        got = m(x, s)
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert m.specializations_made == 2


def test_reshape_with_a_shape_input_and_symbolic_dimensions():
    """Values and shapes together: the key is (the target's values, the batch symbol's binding)."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Relu", ["r"], ["y"])]
    model = _model(nodes, [_vi("x", ["N", 6]), _vi("shape", [3], TensorProto.INT64)], [_vi("y", ["a", "b", "c"])])
    program = from_onnx(model, input_shapes={"x": (("N", 1, 16), 6)})
    m = edgerun.load(program)
    rng = np.random.default_rng(2)
    calls = [(2, [0, 3, 2]), (2, [-1, 2, 3]), (5, [0, 3, 2]), (2, [0, 3, 2])]
    for n, target in calls:
        x = rng.standard_normal((n, 6)).astype(np.float32)
        s = np.array(target, np.int64)
        (want,) = _ort(model, {"x": x, "shape": s})
        np.testing.assert_array_equal(m(x, s), want)
    assert program.imports_made == 2  # per target value; each import is a template over N
    assert m.specializations_made == 3  # per (target value, N)


def test_a_large_value_deciding_input_is_refused_naming_it():
    """A Reshape target computed from a data tensor: the data would have to be the key. Refused at import."""
    nodes = [helper.make_node("ReduceMax", ["d"], ["m"], keepdims=0),
             helper.make_node("Cast", ["m"], ["n0"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["n0", "one"], ["n"]),
             helper.make_node("Concat", ["n", "minus_one"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    minus_one = helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1])
    graph = helper.make_graph(nodes, "g", [_vi("x", [12]), _vi("d", [10, 10])], [_vi("y", ["a", "b"])],
                              initializer=[one, minus_one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    with pytest.raises(ValueBindingError, match=rf"input 'd' \(shape 10x10\).*Reshape.*at most {MAX_VALUE_ELEMENTS}"):
        from_onnx(model)


def test_a_top_k_whose_k_is_computed_from_data_runs_as_a_data_dependent_op():
    """TopK's k from a data tensor is not a value to key on: the op's output length is bound when it runs."""
    nodes = [helper.make_node("ReduceMax", ["d"], ["m"], keepdims=0),
             helper.make_node("Cast", ["m"], ["k0"], to=TensorProto.INT64),
             helper.make_node("Reshape", ["k0", "one"], ["k"]),
             helper.make_node("TopK", ["x", "k"], ["v", "i"])]
    one = helper.make_tensor("one", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(nodes, "g", [_vi("x", [10]), _vi("d", [10, 10])],
                              [_vi("v", ["k"]), _vi("i", ["k"], TensorProto.INT64)], initializer=[one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    program = from_onnx(model)
    assert not isinstance(program, ValueTemplate)
    loaded = edgerun.load(program)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(10).astype(np.float32)
    for top in (0, 3, 10):
        d = np.full((10, 10), float(top), np.float32)
        for got, want in zip(loaded.run({"x": x, "d": d}), _ort(model, {"x": x, "d": d})):
            np.testing.assert_array_equal(got, want)


def test_a_saved_value_template_loads_and_specialises_per_value(tmp_path):
    model = _reduce_sum_model()
    path = tmp_path / "m.edgerun"
    from_onnx(model).save(path)
    # The runtime needs numpy alone: it names the frontend that opens such a file, which imports it again.
    with pytest.raises(EdgerunError, match=r"open it with edgerun.frontends.onnx.ValueTemplate.from_program"):
        edgerun.load(path)
    m = edgerun.load(ValueTemplate.from_program(Program.read(path)))
    assert m.value_inputs == ["axes"] and m.output_names == ["y"]
    x = np.random.default_rng(4).standard_normal((2, 3, 4)).astype(np.float32)
    for axes in ([1], [0], [-1]):
        a = np.array(axes, np.int64)
        np.testing.assert_allclose(m(x, a), _ort(model, {"x": x, "axes": a})[0], rtol=1e-5, atol=1e-6)
    assert m.specializations_made == 3


def test_a_value_template_needs_its_values():
    program = from_onnx(_reduce_sum_model())
    # Its graph has no outputs of its own: tools that take it whole fail loudly, naming what to do.
    with pytest.raises(EdgerunError, match=r"exists per value of inputs \['axes'\]"):
        edgerun.quantize(program)
    m = edgerun.load(program)
    with pytest.raises(EdgerunError, match=r"inputs \['axes'\] decide this program's structure"):
        m.specialization(x=(2, 3, 4))
    with pytest.raises(ValueBindingError, match=r"input 'axes' decides the program's structure"):
        program.for_values({"x": np.zeros((2, 3, 4), np.float32)})
    loaded = m.specialization([np.zeros((2, 3, 4), np.float32), np.array([1], np.int64)])
    assert loaded.output_specs[loaded.output_names[0]].shape == (2, 1, 4)


@pytest.mark.parametrize("name,runner", [
    ("test_reduce_sum_keepdims_random", symbolic_runner), ("test_unsqueeze_two_axes", symbolic_runner),
    ("test_slice", symbolic_runner), ("test_top_k", edgerun_runner),
    ("test_resize_downsample_scales_linear", edgerun_runner)])  # these two need static sizes
def test_conformance_cases_pass_without_freezing(name, runner):
    """Node cases that used to need their inputs frozen: one import, the value inputs bound at call time
    (with every input dimension symbolic as well, where the op allows it)."""
    case = next(c for c in node_cases() if c.name == name)
    rep = EdgerunBackend.prepare(case.model)
    assert rep.value_inputs
    result = run_case(case, runner)
    assert result.status == "pass", result.detail
    assert result.value_inputs


def test_a_value_of_another_shape_than_declared_is_refused():
    m = edgerun.load(from_onnx(_reduce_sum_model()))
    with pytest.raises(EdgerunError, match=r"input 'axes' is int64\[2\], the program takes int64\[1\]"):
        m(np.zeros((2, 3, 4), np.float32), np.array([0, 1], np.int64))


def test_more_values_than_the_cache_holds_stay_correct_after_eviction():
    """Slice with its start as an input: twelve starts through an LRU of eight, then the evicted ones again."""
    nodes = [helper.make_node("Slice", ["x", "start", "end"], ["y"])]
    end = helper.make_tensor("end", TensorProto.INT64, [1], [20])
    graph = helper.make_graph(nodes, "g", [_vi("x", [20]), _vi("start", [1], TensorProto.INT64)], [_vi("y", ["k"])],
                              initializer=[end])
    program = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8))
    m = edgerun.load(program)
    x = np.arange(20, dtype=np.float32)
    starts = [*range(12), 0, 1, 2]
    for start in starts:
        np.testing.assert_array_equal(m(x, np.array([start], np.int64)), x[start:])
    assert len(m.cached_bindings) == 8  # the runtime's LRU: the first starts were evicted, then loaded again
    assert m.specializations_made == len(starts)
