"""Control-flow nodes at load time: each placed whole on a backend that runs it and everything in its bodies
(Backend.control_flow), never anywhere else; ONNX Runtime takes cond/while_loop/scan as If/Loop/Scan, the
reference backend runs them through the oracle; every placement gives the oracle's answers."""

from __future__ import annotations

import numpy as np
import pytest
from control_flow_graphs import F32, body, cond_graph, scan_expected, scan_graph, while_graph

import edgerun
from edgerun.backends.registry import get_backend
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import add_subgraph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.passes import optimize
from edgerun.program import Program

pytest.importorskip("onnxruntime")

X = np.array([1.5, -2.0, 3.25], np.float32)
CASES = {
    "cond": (cond_graph, [[X, np.array(True)], [X, np.array(False)]]),
    "while_loop": (while_graph, [[X, np.array(n)] for n in (0, 1, 4)]),
    "scan": (scan_graph, [[X, np.arange(12, dtype=np.float32).reshape(4, 3) - 5, np.array(0.5, np.float32)]]),
}


def _placed(model: edgerun.LoadedProgram) -> dict[str, str]:
    return {n.op: p.backend for p in model.parts.partitions for n in p.nodes}


@pytest.mark.parametrize("op", sorted(CASES))
@pytest.mark.parametrize("backends", [["reference"], ["onnxruntime", "reference"], "auto"])
def test_each_control_flow_op_runs_whole_where_placed_and_matches_the_oracle(op, backends, tmp_path):
    make, feeds = CASES[op]
    graph, _ = optimize(make())
    path = tmp_path / f"{op}.edgerun"
    Program(graph).save(path)
    model = edgerun.load(str(path), backends=backends)
    placed = _placed(model)[op]
    assert placed in ({"reference"} if backends == ["reference"] else {"onnxruntime", "reference"})
    if backends == ["onnxruntime", "reference"]:
        assert placed == "onnxruntime"  # ORT runs every node of these bodies, so it takes the whole op
    for args in feeds:
        want = interpret(graph, args)
        got = model(*args)
        got = got if isinstance(got, (list, tuple)) else [got]
        for w, g in zip(want, got):
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_scan_results_are_the_recurrence():
    xs = np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    h, ys = edgerun.load(scan_graph(), backends=["onnxruntime", "reference"])(X, xs, np.array(2.0, np.float32))
    want_h, want_ys = scan_expected(X, xs, 2.0)
    np.testing.assert_allclose(h, want_h)
    np.testing.assert_allclose(ys, want_ys)


def _cond_with_python_modulo() -> Graph:
    """A cond whose then-branch uses float mod with the divisor's sign, which ONNX Runtime does not claim."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((3,), F32))
    p = g.add_input("p", TensorSpec((), DType.bool))
    spec = [TensorSpec((3,), F32)]
    then = add_subgraph(g, body(lambda b, a: [b.emit("mod", [a, b.const(np.full(3, 2.0, np.float32))],
                                                     fmod=False)], spec), "then")
    other = add_subgraph(g, body(lambda b, a: [b.emit("exp", [a])], spec), "else")
    y = b.emit("cond", [p, x], then=then, **{"else": other})
    g.outputs = [b.emit("add", [y, x])]
    return g


@pytest.mark.parametrize("backends", [["onnxruntime", "reference"], "auto"])
def test_a_body_op_the_delegate_cannot_run_keeps_the_whole_op_off_it(backends):
    graph = _cond_with_python_modulo()
    ort = get_backend("onnxruntime")
    assert not ort.supports(graph.nodes[0], graph)
    model = edgerun.load(graph, backends=backends)
    assert _placed(model)["cond"] == "reference"
    for p in (True, False):
        np.testing.assert_allclose(model(X, np.array(p)), interpret(graph, [X, np.array(p)])[0], rtol=1e-6)


def test_a_forced_placement_on_a_backend_that_cannot_run_the_op_is_refused_with_a_warning():
    graph = _cond_with_python_modulo()
    with pytest.warns(RuntimeWarning, match="does not support node"):
        model = edgerun.load(graph, backends=["onnxruntime", "reference"],
                             placement={graph.nodes[0].name: "onnxruntime"})
    assert _placed(model)["cond"] == "reference"


def test_bodies_of_a_node_left_on_the_reference_load_through_the_runtime():
    """Bodies that return an input, the same value twice, or a constant, run as programs of their own."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((3,), F32))
    p = g.add_input("p", TensorSpec((), DType.bool))
    spec = [TensorSpec((3,), F32)]
    then = add_subgraph(g, body(lambda b, a: [a, a], spec))
    other = add_subgraph(g, body(lambda b, a: [b.emit("mod", [a, b.const(np.full(3, 2.0, np.float32))], fmod=False),
                                                b.const(np.ones(3, np.float32))], spec))
    g.outputs = b.emit_multi("cond", [p, x], then=then, **{"else": other})
    for backends in (["reference"], ["onnxruntime", "reference"]):
        model = edgerun.load(g, backends=backends)
        assert _placed(model)["cond"] == "reference"
        for q in (True, False):
            for got, want in zip(model(X, np.array(q)), interpret(g, [X, np.array(q)])):
                np.testing.assert_array_equal(got, want)
