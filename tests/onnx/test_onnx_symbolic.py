"""Symbolic input dimensions in the ONNX frontend: input_shapes with bounds, shape arithmetic folded over symbols,
and one imported program run at several shapes against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_graphs import make_model as _model
from onnx_graphs import run_onnxruntime as _ort
from onnx_graphs import value_info as _vi

import edgerun
from edgerun.cli import main
from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.onnx import OnnxModelError, from_onnx, import_onnx_graph
from edgerun.ir.symbolic import SymDim, sym
from edgerun.program import Program


def _i64(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def _flatten_batch_model():
    """y = reshape(x, [N, C*H*W]) with the target computed from Shape(x), as exporters write it."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    inits = [_i64("zero", 0), _i64("zero1", [0]), _i64("minus1", [-1])]
    return _model(nodes, [_vi("x", ["N", 3, "H", 4])], [_vi("y", ["N", "K"])], inits)


def test_bounded_symbols_make_one_template_for_every_shape():
    model = _flatten_batch_model()
    program = from_onnx(model, input_shapes={"x": (("N", 1, 8), 3, ("H", 2, 16), 4)})
    g = program.graph
    assert g.symbols == {"N": (1, 8), "H": (2, 16)}
    assert g.specs[g.inputs[0]].shape == (sym("N"), 3, sym("H"), 4)
    # Shape -> Gather -> Concat folded over the symbols: the reshape target is symbolic, not a run-time value.
    assert g.specs[g.outputs[0]].shape == (sym("N"), 12 * sym("H"))
    m = edgerun.load(program, backends="reference")
    rng = np.random.default_rng(0)
    for shape in [(1, 3, 2, 4), (5, 3, 7, 4), (8, 3, 16, 4)]:
        x = rng.standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(m(x), _ort(model, {"x": x})[0])


def test_a_call_outside_the_bounds_names_the_input_and_dimension():
    m = edgerun.load(from_onnx(_flatten_batch_model(), input_shapes={"x": (("N", 1, 8), 3, ("H", 2, 16), 4)}),
                     backends="reference")
    with pytest.raises(EdgerunError, match=r"input 'x' dimension 2 is 17.*\[2, 16\]"):
        m(np.zeros((1, 3, 17, 4), np.float32))


def test_a_dynamic_dimension_without_bounds_is_refused_with_the_form_to_pass():
    with pytest.raises(UnsupportedOpError) as err:
        from_onnx(_flatten_batch_model(), input_shapes={"x": (2, 3, None, 4)}, unsized="refuse")
    assert "input_shapes['x'] dimension 2" in str(err.value) or "dimension 2" in str(err.value)
    with pytest.raises(UnsupportedOpError, match=r"dimensions 0 \('N'\), 2 \('H'\) are dynamic.*\(name, min, max\)"):
        from_onnx(_flatten_batch_model(), unsized="refuse")
    with pytest.raises(OnnxModelError, match=r"symbol 'H' without bounds"):
        from_onnx(_flatten_batch_model(), input_shapes={"x": (2, 3, "H", 4)})


@pytest.mark.parametrize(("dim", "message"), [
    (("H", 16, 2), r"bounds 16\.\.2"),
    (("H", -1, 4), r"bounds -1\.\.4"),
    (("2H", 1, 4), r"invalid symbol name '2H'"),
    (("H", 1), r"give a size or \(name, min, max\)"),
    (("H", 33, 60, 32), r"no multiple of 32 lies within 33\.\.60"),
])
def test_malformed_symbol_declarations_are_refused(dim, message):
    with pytest.raises(OnnxModelError, match=message):
        from_onnx(_flatten_batch_model(), input_shapes={"x": (2, 3, dim, 4)})


def test_a_symbol_on_a_dimension_the_model_fixes_and_two_bounds_for_one_symbol_are_refused():
    with pytest.raises(OnnxModelError, match=r"dimension 1 declares symbol 'C', but the model fixes .* to 3"):
        from_onnx(_flatten_batch_model(), input_shapes={"x": (2, ("C", 1, 4), 5, 4)})
    two = _model([helper.make_node("Add", ["a", "b"], ["y"])], [_vi("a", ["N"]), _vi("b", ["M"])], [_vi("y", ["N"])])
    with pytest.raises(OnnxModelError, match=r"bounds symbol 'N' by 1\.\.9, elsewhere by 1\.\.8"):
        from_onnx(two, input_shapes={"a": (("N", 1, 8),), "b": (("N", 1, 9),)})


def test_an_unlisted_input_takes_the_symbol_of_its_dim_param():
    """silero-vad's shape: input (batch, sequence), state (2, batch, 128); bounding batch once covers both."""
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[1], keepdims=1),
             helper.make_node("Unsqueeze", ["m", "zero"], ["m3"]),
             helper.make_node("Add", ["state", "m3"], ["y"])]
    model = _model(nodes, [_vi("x", ["batch", "sequence"]), _vi("state", [2, "batch", 1])], [_vi("y", [2, "batch", 1])],
                   [_i64("zero", [0])], opset=13)
    g = import_onnx_graph(model, input_shapes={"x": (("batch", 1, 4), ("sequence", 1, 512))})
    assert g.specs["state"].shape == (2, sym("batch"), 1)
    m = edgerun.load(from_onnx(model, input_shapes={"x": (("batch", 1, 4), ("sequence", 1, 512))}),
                     backends="reference")
    rng = np.random.default_rng(1)
    for b, s in [(1, 10), (3, 100)]:
        x, st = rng.standard_normal((b, s)).astype(np.float32), rng.standard_normal((2, b, 1)).astype(np.float32)
        np.testing.assert_allclose(m(x, st), _ort(model, {"x": x, "state": st})[0], rtol=1e-5, atol=1e-6)


def _size_test_model():
    """y = x if H == 1 else x * 2, with the test written as exporters do: Shape -> Gather -> Equal -> Where."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "one"], ["h"], axis=0),
        helper.make_node("Equal", ["h", "one"], ["is_one"]),
        helper.make_node("Cast", ["is_one"], ["f"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["two", "f"], ["k"]),
        helper.make_node("Mul", ["x", "k"], ["y"]),
    ]
    inits = [_i64("one", 1), numpy_helper.from_array(np.float32(2.0), "two")]
    return _model(nodes, [_vi("x", [2, "H"])], [_vi("y", [2, "H"])], inits)


def test_a_comparison_the_bounds_decide_folds_and_one_they_do_not_runs_at_run_time():
    model = _size_test_model()
    decided = import_onnx_graph(model, input_shapes={"x": (2, ("H", 2, 9))})  # H == 1 is false for every shape
    assert "eq" not in [n.op for n in decided.nodes]
    m = edgerun.load(from_onnx(model, input_shapes={"x": (2, ("H", 1, 9))}), backends="reference")
    for h in (1, 2, 9):  # H == 1 depends on the call: computed from the dimension at run time, exactly
        x = np.arange(2 * h, dtype=np.float32).reshape(2, h)
        np.testing.assert_array_equal(m(x), _ort(model, {"x": x})[0])


def test_range_up_to_a_symbolic_size_runs_and_a_symbolic_step_is_refused_naming_the_node():
    def model(step_from_shape):
        nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
                 helper.make_node("Range", ["zero", "n", "n" if step_from_shape else "one"], ["r"], name="positions"),
                 helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
                 helper.make_node("Add", ["x", "rf"], ["y"])]
        return _model(nodes, [_vi("x", ["N"])], [_vi("y", ["N"])], [_i64("zero", 0), _i64("one", 1)])

    m = edgerun.load(from_onnx(model(False), input_shapes={"x": (("N", 1, 64),)}), backends="reference")
    for n in (1, 5, 64):
        x = np.full(n, 0.5, np.float32)
        np.testing.assert_array_equal(m(x), _ort(model(False), {"x": x})[0])
    with pytest.raises(UnsupportedOpError, match=r"'Range' at positions: Range with a symbolic start or delta"):
        from_onnx(model(True), input_shapes={"x": (("N", 1, 64),)})


def test_an_op_that_needs_a_concrete_size_is_refused_naming_the_node_and_the_symbol():
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "zero1"], ["k"]),
             helper.make_node("TopK", ["x", "k"], ["v", "i"], name="sorter")]
    model = _model(nodes, [_vi("x", ["N"])], [_vi("v", ["N"]), _vi("i", ["N"], TensorProto.INT64)],
                   [_i64("zero", 0), _i64("zero1", [0])])
    with pytest.raises(UnsupportedOpError, match=r"'TopK' at sorter: .*'N'"):
        from_onnx(model, input_shapes={"x": (("N", 1, 64),)})


def test_cli_takes_symbol_min_max_dimensions(tmp_path, capsys):
    src, out = tmp_path / "m.onnx", tmp_path / "m.edgerun"
    src.write_bytes(_flatten_batch_model().SerializeToString())
    assert main(["import-onnx", str(src), "-o", str(out), "--input-shape", "x=N:1:8,3,H:2:16,4"]) == 0
    assert "H in [2, 16], N in [1, 8]" in capsys.readouterr().out
    program = Program.read(out)
    assert program.graph.symbols == {"N": (1, 8), "H": (2, 16)}
    with pytest.raises(SystemExit):
        main(["import-onnx", str(src), "-o", str(out), "--input-shape", "x=N:1,3,4,4"])
    assert "SYMBOL:MIN:MAX" in capsys.readouterr().err


def test_symbolic_shape_values_are_object_arrays_of_ints_and_symdims():
    from edgerun.frontends.onnx.symfold import dims_array
    arr = dims_array([1, sym("N") * 2])
    assert arr.dtype == object and isinstance(arr[1], SymDim)
    assert dims_array([1, 2]).dtype == np.int64


def test_top_k_over_a_symbolic_axis_ranks_once_the_shape_is_known():
    """TopK imports as the top_k composite, decomposed per concrete shape; an axis too long for the pairwise
    ranking is refused at the call that brings it, naming the op."""
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=0)
    model = _model([node], [_vi("x", [2, "n"])], [_vi("v", [2, 3]), _vi("i", [2, 3], TensorProto.INT64)],
                   [_i64("k", [3])])
    program = from_onnx(model, input_shapes={"x": (2, ("n", 3, 5000))})
    loaded = edgerun.load(program)
    rng = np.random.default_rng(0)
    for n in (3, 7, 40):
        x = rng.integers(0, 5, (2, n)).astype(np.float32)  # ties: the lower index first
        for got, want in zip(loaded.run({"x": x}), _ort(model, {"x": x})):
            np.testing.assert_array_equal(got, want)
    with pytest.raises(UnsupportedOpError, match=r"top_k.*pairwise ranking"):
        loaded.run({"x": np.zeros((2, 4000), np.float32)})
