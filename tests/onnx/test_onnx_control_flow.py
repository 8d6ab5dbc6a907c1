"""ONNX If, Loop and Scan imported as the IR's cond, while_loop and scan, checked against ONNX Runtime.

Includes a real model with real weights from a PyPI wheel: silero-vad's VAD, whose If branches on the
sample-rate input `sr` (each branch is the whole network, LSTM included), imported once without freezing
`sr` and run over a sequence of stateful calls at both sample rates.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_graphs import make_model as _model
from onnx_graphs import run_onnxruntime as _ort
from onnx_graphs import value_info as _vi

import edgerun
from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.onnx import from_onnx, import_onnx_graph
from edgerun.frontends.onnx.context import DynamicInputError
from edgerun.oracle import interpret

ort = pytest.importorskip("onnxruntime")


def _branch(name, nodes, out_shape=(2,), inits=()):
    return helper.make_graph(nodes, name, [], [_vi("out", list(out_shape))], initializer=list(inits))


def _if_model(then_branch, else_branch):
    cond = helper.make_node("Greater", ["s", "zero"], ["cond"])
    node = helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch)
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    return _model([cond, node], [_vi("x", [2]), _vi("s", [], TensorProto.INT64)], [_vi("y", [2])], [zero])


def test_if_on_a_run_time_condition_becomes_cond_and_runs_only_the_branch_taken():
    # then: a Gather with out-of-range indices for any x: only safe because the branch is not run when not taken.
    idx = numpy_helper.from_array(np.array([0, 1], np.int64), "idx")
    then = _branch("then", [helper.make_node("Gather", ["x", "idx"], ["g"]),
                            helper.make_node("Mul", ["g", "x"], ["out"])], inits=[idx])
    other = _branch("else", [helper.make_node("Neg", ["x"], ["out"])])
    model = _if_model(then, other)
    program = from_onnx(model)
    assert "cond" in program.graph.op_counts() and "where" not in program.graph.op_counts()
    loaded = edgerun.load(program, backends=["onnxruntime", "reference"])
    x = np.array([1.5, -2.0], np.float32)
    for s in (5, 0, -1):
        want = _ort(model, {"x": x, "s": np.array(s)})[0]
        np.testing.assert_allclose(interpret(program.graph, [x, np.array(s)])[0], want)
        np.testing.assert_allclose(loaded(x, np.array(s)), want)


def test_branches_of_different_shapes_are_refused():
    wide = _branch("then", [helper.make_node("Concat", ["x", "x"], ["out"], axis=0)], out_shape=(4,))
    other = _branch("else", [helper.make_node("Neg", ["x"], ["out"])])
    with pytest.raises(UnsupportedOpError, match=r"cond branches give \(float32\[4\]\) and \(float32\[2\]\)"):
        from_onnx(_if_model(wide, other))


def test_if_on_an_import_time_condition_inlines_the_branch():
    then = _branch("then", [helper.make_node("Neg", ["x"], ["out"])])
    other = _branch("else", [helper.make_node("Abs", ["x"], ["out"])])
    graph = import_onnx_graph(_if_model(then, other), constant_inputs={"s": np.array(3)})
    assert graph.op_counts() == {"neg": 1}


def _counting_loop(with_scan_output: bool, trip_input: bool = True):
    """y = x * 2^trips; without stacked outputs it stops early once y's sum passes `limit`, with them it stacks
    y per trip."""
    body_nodes = [helper.make_node("Mul", ["y_in", "two"], ["y_out"])]
    if with_scan_output:  # a for-loop, as exporters write one: the condition passes through
        body_nodes.append(helper.make_node("Identity", ["c"], ["cond_out"]))
    else:
        body_nodes += [helper.make_node("ReduceSum", ["y_out"], ["total"], keepdims=0),
                       helper.make_node("Less", ["total", "limit"], ["cond_out"])]
    outputs = [_vi("cond_out", [], TensorProto.BOOL), _vi("y_out", [3])]
    if with_scan_output:
        body_nodes.append(helper.make_node("Identity", ["y_out"], ["y_scan"]))
        outputs.append(_vi("y_scan", [3]))
    body = helper.make_graph(body_nodes, "body", [_vi("i", [], TensorProto.INT64), _vi("c", [], TensorProto.BOOL),
                                                  _vi("y_in", [3])], outputs)
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(True), "true")]
    inputs = [_vi("x", [3])] + ([] if with_scan_output else [_vi("limit", [])])
    if trip_input:
        inputs.append(_vi("trips", [], TensorProto.INT64))
    loop = helper.make_node("Loop", ["trips" if trip_input else "", "true", "x"],
                            ["y", "ys"] if with_scan_output else ["y"], body=body)
    outs = [_vi("y", [3])] + ([_vi("ys", [None, 3])] if with_scan_output else [])
    return _model([loop], inputs, outs, inits)


@pytest.mark.parametrize("trips,limit", [(0, 1e9), (3, 1e9), (10, 50.0), (10, 1.0)])
def test_loop_with_a_run_time_trip_count_and_condition_becomes_while_loop(trips, limit):
    model = _counting_loop(with_scan_output=False)
    program = from_onnx(model)
    assert "while_loop" in program.graph.op_counts()
    x = np.array([1.0, 2.0, 0.5], np.float32)
    feeds = {"x": x, "limit": np.array(limit, np.float32), "trips": np.array(trips)}
    want = _ort(model, feeds)[0]
    args = [feeds[n] for n in program.graph.inputs]
    np.testing.assert_allclose(interpret(program.graph, args)[0], want)
    for backends in (["reference"], ["onnxruntime", "reference"]):
        np.testing.assert_allclose(edgerun.load(program, backends=backends)(*args), want)


def test_loop_with_stacked_outputs_needs_its_trip_count_at_import():
    model = _counting_loop(with_scan_output=True)
    with pytest.raises(DynamicInputError, match=r"trip count or condition is known only at run time.*'trips'"):
        import_onnx_graph(model)
    program = from_onnx(model, constant_inputs={"trips": np.array(4)})
    x = np.array([1.0, 2.0, 0.5], np.float32)
    assert "scan" in program.graph.op_counts()
    want_y, want_ys = _ort(model, {"x": x, "trips": np.array(4)})
    for y, ys in (interpret(program.graph, [x]), edgerun.load(program, backends=["onnxruntime", "reference"])(x)):
        np.testing.assert_allclose(y, want_y)
        np.testing.assert_allclose(ys, want_ys)
    # Without freezing, from_onnx specialises on the trip count at each call (value_template.py).
    template = edgerun.load(from_onnx(model))
    assert template.value_inputs == ["trips"]
    for trips in (4, 2):
        want_y, want_ys = _ort(model, {"x": x, "trips": np.array(trips)})
        y, ys = template(x, np.array(trips))
        np.testing.assert_allclose(y, want_y)
        np.testing.assert_allclose(ys, want_ys)


def test_scan_with_axes_and_directions_matches_onnxruntime():
    body = helper.make_graph(
        [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_out", "w"], ["y_t"])],
        "body", [_vi("s_in", [2]), _vi("x_t", [2])], [_vi("s_out", [2]), _vi("y_t", [2])])
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1],
                            scan_output_directions=[1])
    model = _model([node], [_vi("s0", [2]), _vi("xs", [2, 5]), _vi("w", [2])], [_vi("s", [2]), _vi("ys", [2, 5])])
    program = from_onnx(model)
    rng = np.random.default_rng(0)
    feeds = {"s0": rng.standard_normal(2).astype(np.float32), "xs": rng.standard_normal((2, 5)).astype(np.float32),
             "w": rng.standard_normal(2).astype(np.float32)}
    want = _ort(model, feeds)
    for got in (interpret(program.graph, [feeds[n] for n in program.graph.inputs]),
                edgerun.load(program, backends=["onnxruntime", "reference"])(*[feeds[n] for n in program.graph.inputs])):
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def _silero(name: str) -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        pytest.skip("silero-vad is not installed (scripts/setup.sh installs it with --no-deps)")
    path = Path(spec.origin).parent / "data" / name
    if not path.is_file():
        pytest.skip(f"silero-vad has no {name}")
    return path


def _calls(program, session, length, sr, backends):
    """Three calls feeding the state back, as silero's own wrapper does, against ONNX Runtime doing the same."""
    model = edgerun.load(program, backends=backends)
    rng = np.random.default_rng(sr)
    ours = theirs = np.zeros((2, 1, 128), np.float32)
    for _ in range(3):
        x = (rng.standard_normal((1, length)) * 0.1).astype(np.float32)
        feeds = {"input": x, "state": ours, "sr": np.array(sr)}
        prob, ours = model(*[feeds[n] for n in program.graph.inputs])
        want_prob, theirs = session.run(None, {"input": x, "state": theirs, "sr": np.array(sr)})
        np.testing.assert_allclose(prob, want_prob, rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["silero_vad.onnx", "silero_vad_op18_ifless.onnx"])
def test_silero_vad_imports_once_and_matches_onnxruntime_at_both_sample_rates(name):
    path = _silero(name)
    # 256 samples at 8 kHz plus 32 of context: a chunk length both branches accept, so one import serves both.
    program = from_onnx(str(path), input_shapes={"input": (1, 288), "state": (2, 1, 128)})
    assert "sr" in program.graph.inputs
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for sr in (16000, 8000):
        _calls(program, session, 288, sr, ["reference"])
    _calls(program, session, 288, 8000, ["onnxruntime", "reference"])


def test_silero_vad_at_a_16khz_chunk_leaves_out_the_8khz_branch_with_a_clear_error():
    path = _silero("silero_vad.onnx")
    program = from_onnx(str(path), input_shapes={"input": (1, 576), "state": (2, 1, 128)})
    (cond,) = [n for n in program.graph.nodes if n.op == "cond"]
    assert cond.attrs["else"] == "" and "LSTM" in cond.attrs["unreachable"]  # ORT fails there too
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    _calls(program, session, 576, 16000, ["onnxruntime", "reference"])
    model = edgerun.load(program, backends=["onnxruntime", "reference"])
    feeds = {"input": np.zeros((1, 576), np.float32), "state": np.zeros((2, 1, 128), np.float32),
             "sr": np.array(8000)}
    with pytest.raises(EdgerunError, match="took its else branch, which cannot run at this program's shapes"):
        model(*[feeds[n] for n in program.graph.inputs])
