"""ONNX If on a run-time condition: a `where` select of both branches when that is exactly right, otherwise
a refusal that names the graph input to freeze with constant_inputs=.

Includes real models with real weights from a PyPI wheel: silero-vad's VAD models, whose If branches on the
sample-rate input `sr` (each branch is the whole model, far too big to run both).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx import from_onnx, import_onnx_graph
from edgerun.oracle import interpret


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _branch(name, nodes, out_shape=(2,), inits=()):
    return helper.make_graph(nodes, name, [], [_vi("out", list(out_shape))], initializer=list(inits))


def _scaled(value, name):
    k = numpy_helper.from_array(np.full(2, value, np.float32), f"k_{name}")
    return _branch(name, [helper.make_node("Mul", ["x", f"k_{name}"], ["out"])], inits=[k])


def _if_model(then_branch, else_branch):
    cond = helper.make_node("Greater", ["s", "zero"], ["cond"])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    return _model([cond, node], [_vi("x", [2]), _vi("s", [], TensorProto.INT64)], [_vi("y", [2])], [zero])


def test_small_safe_branches_become_a_where_select():
    graph = import_onnx_graph(_if_model(_scaled(2.0, "then"), _scaled(3.0, "else")))
    assert "where" in [n.op for n in graph.nodes]
    x = np.array([1.0, -2.0], np.float32)
    for s, want in [(5, x * 2), (0, x * 3), (-1, x * 3)]:
        np.testing.assert_array_equal(interpret(graph, [x, np.array(s, np.int64)])[0], want)


def test_nan_in_the_branch_not_taken_does_not_leak():
    """then: x * inf (inf/NaN for some x); the select must give else's values exactly."""
    graph = import_onnx_graph(_if_model(_scaled(np.inf, "then"), _scaled(1.0, "else")))
    x = np.array([0.0, 1.5], np.float32)
    np.testing.assert_array_equal(interpret(graph, [x, np.array(0, np.int64)])[0], x)
    assert np.isnan(interpret(graph, [x, np.array(1, np.int64)])[0][0])  # 0 * inf, the taken branch


def test_branch_that_could_fail_is_refused_naming_the_input_to_freeze():
    idx = numpy_helper.from_array(np.array([0, 1], np.int64), "idx")
    gather = _branch("then", [helper.make_node("Gather", ["x", "idx"], ["out"])], inits=[idx])
    m = _if_model(gather, _scaled(3.0, "else"))
    with pytest.raises(UnsupportedOpError) as err:
        from_onnx(m)
    text = str(err.value)
    assert "If on a condition computed at run time" in text and "uses Gather" in text
    assert "constant_inputs={'s': <int64[] value>}" in text
    program = from_onnx(m, constant_inputs={"s": np.array(1)})
    np.testing.assert_array_equal(interpret(program.graph, [np.array([4.0, 5.0], np.float32)])[0], [4, 5])


def test_branches_of_different_shapes_are_refused():
    wide = _branch("then", [helper.make_node("Concat", ["x", "x"], ["out"], axis=0)], out_shape=(4,))
    with pytest.raises(UnsupportedOpError, match=r"the branches give float32\[4\] and float32\[2\]"):
        from_onnx(_if_model(wide, _scaled(3.0, "else")))


def _silero(name: str) -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        pytest.skip("silero-vad is not installed (scripts/setup.sh installs it with --no-deps)")
    path = Path(spec.origin).parent / "data" / name
    if not path.is_file():
        pytest.skip(f"silero-vad has no {name}")
    return path


@pytest.mark.parametrize("name", ["silero_vad.onnx", "silero_vad_op18_ifless.onnx"])
def test_silero_vad_names_constant_inputs_then_matches_onnxruntime_over_calls(name):
    ort = pytest.importorskip("onnxruntime")
    path = _silero(name)
    shapes = {"input": (1, 576), "state": (2, 1, 128)}  # 512 samples at 16 kHz and 64 of context
    with pytest.raises(UnsupportedOpError, match=r"constant_inputs=\{'sr': <int64\[\] value>\}"):
        from_onnx(str(path), input_shapes=shapes)
    program = from_onnx(str(path), input_shapes=shapes, constant_inputs={"sr": np.array(16000)})
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    ours = theirs = np.zeros((2, 1, 128), np.float32)
    for _ in range(3):  # the recurrent state is fed back, as silero's own wrapper does
        x = (rng.standard_normal((1, 576)) * 0.1).astype(np.float32)
        feeds = {"input": x, "state": ours}
        prob, ours = interpret(program.graph, [feeds[n] for n in program.graph.inputs])
        want_prob, theirs = session.run(None, {"input": x, "state": theirs, "sr": np.array(16000)})
        np.testing.assert_allclose(prob, want_prob, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
