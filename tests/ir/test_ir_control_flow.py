"""Control-flow ops in the IR: shape rules that check body signatures, the oracle running each branch and
trip count, the passes keeping their meaning, and the program file storing bodies (and their weights)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from control_flow_graphs import F32, I64, body, cond_graph, scan_expected, scan_graph, while_graph

from edgerun.backends.base import node_work
from edgerun.errors import EdgerunError, ProgramFormatError, VerificationError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import add_subgraph, flat_constants
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.ir.verifier import verify
from edgerun.oracle import interpret
from edgerun.passes import optimize
from edgerun.program import FORMAT_MINOR, Program
from edgerun.program.graph_codec import decode_graph, encode_graph

X = np.array([1.0, -2.0, 3.0], np.float32)


def _gelu(x: np.ndarray) -> np.ndarray:
    return np.array([0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x], np.float32)


def test_cond_runs_the_branch_the_predicate_picks():
    g = cond_graph()
    verify(g)
    np.testing.assert_allclose(interpret(g, [X, np.array(True)])[0], _gelu(X) * [1, 2, 3], rtol=1e-6)
    np.testing.assert_array_equal(interpret(g, [X, np.array(False)])[0], -X)


@pytest.mark.parametrize("n", [0, 1, 5])
def test_while_loop_runs_a_run_time_trip_count(n):
    i, y = interpret(while_graph(), [X, np.array(n)])
    assert int(i) == n
    np.testing.assert_array_equal(y, X * 2.0 ** n + (2.0 ** n - 1))


def test_scan_carries_state_and_stacks_per_step_results():
    h0, xs = np.array([0.5, -1, 2], np.float32), np.arange(12, dtype=np.float32).reshape(4, 3) - 5
    h, ys = interpret(scan_graph(), [h0, xs, np.array(2.0, np.float32)])
    want_h, want_ys = scan_expected(h0, xs, 2.0)
    np.testing.assert_allclose(h, want_h)
    np.testing.assert_allclose(ys, want_ys)


def _cond_with(then_body: Graph) -> Graph:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((3,), F32))
    p = g.add_input("p", TensorSpec((), DType.bool))
    other = add_subgraph(g, body(lambda b, a: [b.emit("neg", [a])], [TensorSpec((3,), F32)]), "else")
    then = add_subgraph(g, then_body, "then")
    b.emit("cond", [p, x], then=then, **{"else": other})
    return g


def test_branches_that_disagree_are_refused_with_both_signatures():
    wide = body(lambda b, a: [b.emit("concat", [a, a], axis=0)], [TensorSpec((3,), F32)])
    with pytest.raises(ValueError, match=r"cond branches give \(float32\[6\]\) and \(float32\[3\]\)"):
        _cond_with(wide)
    other_input = body(lambda b, a: [a], [TensorSpec((3,), I64)])
    with pytest.raises(ValueError, match=r"cond then branch takes \(int64\[3\]\), the node passes \(float32\[3\]\)"):
        _cond_with(other_input)


def test_verifier_checks_bodies_and_names_the_subgraph():
    g = cond_graph()
    then = g.subgraphs[g.nodes[-1].attrs["then"]]
    then.outputs = ["nowhere"]
    with pytest.raises(VerificationError, match=r"subgraph 'then_0'.*graph output 'nowhere' is never defined"):
        verify(g)
    g = cond_graph()
    g.nodes[-1].attrs["else"] = "missing"
    with pytest.raises(VerificationError, match=r"names subgraph 'missing', which the graph does not have"):
        verify(g)


def test_while_loop_body_must_keep_carried_shapes():
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((3,), F32))
    specs = [TensorSpec((3,), F32)]
    cond = add_subgraph(g, body(lambda b, a: [b.emit("reduce_max", [b.emit("gt", [a, a])], axes=[0])], specs))
    grow = add_subgraph(g, body(lambda b, a: [b.emit("concat", [a, a], axis=0)], specs))
    with pytest.raises(ValueError, match=r"carried shapes are fixed"):
        b.emit_multi("while_loop", [x], cond=cond, body=grow, num_carried=1)


def test_scan_length_must_match_its_sequences():
    g = scan_graph()
    g.nodes[-1].attrs["length"] = 5
    with pytest.raises(VerificationError, match=r"leading axis must be the length 5"):
        verify(g)


def test_a_taken_branch_left_out_is_a_clear_run_time_error():
    g = cond_graph()
    node = g.nodes[-1]
    node.attrs.update({"else": "", "unreachable": "an LSTM needs a 3-D input here"})
    del g.subgraphs["else_1"]
    verify(g)
    np.testing.assert_allclose(interpret(g, [X, np.array(True)])[0], _gelu(X) * [1, 2, 3], rtol=1e-6)
    with pytest.raises(EdgerunError, match=r"took its else branch, which cannot run at this program's shapes: "
                                           r"an LSTM needs a 3-D input here"):
        interpret(g, [X, np.array(False)])
    node.attrs.pop("unreachable")
    with pytest.raises(VerificationError, match="without saying why"):
        verify(g)


def test_passes_recurse_into_bodies_and_keep_the_meaning():
    g = cond_graph()
    optimized, _ = optimize(g)
    verify(optimized, allow_composite=True)
    then = optimized.subgraphs[optimized.nodes[-1].attrs["then"]]
    assert "gelu" in then.op_counts()  # a program composite, kept whole inside the body as outside
    for p in (True, False):
        np.testing.assert_allclose(interpret(optimized, [X, np.array(p)])[0], interpret(g, [X, np.array(p)])[0],
                                   rtol=1e-6)
    # A dead control-flow node goes, and its bodies with it.
    g.outputs = ["x"]
    pruned, _ = optimize(g)
    assert not pruned.subgraphs and not pruned.nodes


def test_constant_folding_evaluates_a_cond_on_a_known_predicate():
    g = cond_graph()
    g.inputs.remove("p")
    g.constants["p"] = np.array(False)
    optimized, _ = optimize(g)
    assert "cond" not in optimized.op_counts()
    np.testing.assert_array_equal(interpret(optimized, [X])[0], -X)


def test_program_file_stores_bodies_and_their_weights(tmp_path):
    g, _ = optimize(cond_graph())
    assert any(k.startswith("then_0::") for k in flat_constants(g))  # the body's weight w
    path = tmp_path / "cond.edgerun"
    Program(g).save(path)
    loaded = Program.read(path)
    assert loaded.file_info is not None and loaded.file_info.format_version[1] == FORMAT_MINOR >= 2
    verify(loaded.graph)
    assert set(loaded.graph.subgraphs) == set(g.subgraphs)
    for p in (True, False):
        np.testing.assert_allclose(interpret(loaded.graph, [X, np.array(p)])[0], interpret(g, [X, np.array(p)])[0])
    assert Program(g).program_hash() == loaded.program_hash()


def test_nested_bodies_round_trip():
    outer = Graph()
    b = Builder(outer)
    x = outer.add_input("x", TensorSpec((3,), F32))
    p = outer.add_input("p", TensorSpec((), DType.bool))
    inner = cond_graph()  # a body that holds a cond of its own: inputs x, p
    then = add_subgraph(outer, inner, "then")
    other = add_subgraph(outer, body(lambda b, a, q: [b.emit("abs", [a])],
                                     [TensorSpec((3,), F32), TensorSpec((), DType.bool)]), "else")
    outer.outputs = [b.emit("cond", [p, x, p], then=then, **{"else": other})]
    loaded = Program.from_bytes(Program(outer).to_bytes()).graph
    verify(loaded)
    for q in (True, False):
        np.testing.assert_allclose(interpret(loaded, [X, np.array(q)])[0], interpret(outer, [X, np.array(q)])[0])


def test_graphs_without_bodies_encode_as_before_and_a_body_weight_needs_its_segment():
    plain = Graph()
    plain.outputs = [Builder(plain).emit("neg", [plain.add_input("x", TensorSpec((3,), F32))])]
    assert "subgraphs" not in encode_graph(plain)
    g, _ = optimize(cond_graph())
    names = flat_constants(g)
    doc = encode_graph(g)
    decode_graph(doc, names)
    with pytest.raises(ProgramFormatError, match=r"subgraph 'then_0' constant .* has no weight segment"):
        decode_graph(doc, [n for n in names if not n.startswith("then_0::")])


def test_work_of_a_control_flow_node_counts_its_bodies():
    g = while_graph()
    flops, moved = node_work(g.nodes[-1], g)
    assert flops > 0 and moved > 0
