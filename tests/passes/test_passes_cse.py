"""CommonSubexpressionPass: repeated nodes and constants become one; graph outputs keep their names."""

from __future__ import annotations

import numpy as np
from passes_testkit import assert_same_outputs, decomposed, graph_with_input

from edgerun.passes.common_subexpression_pass import CommonSubexpressionPass


def test_softmax_computes_exp_once() -> None:
    g, b, x = graph_with_input((2, 5))
    g.outputs = [b.emit("softmax", [x], axis=-1)]
    plain = decomposed(g)
    assert plain.op_counts()["exp"] == 2
    merged = CommonSubexpressionPass().call(plain.copy()).graph
    assert merged.op_counts()["exp"] == 1
    assert_same_outputs(plain, merged)


def test_equal_constants_merge_and_let_their_readers_merge() -> None:
    g, b, x = graph_with_input((3,))
    one_a = b.const(np.ones(3, dtype=np.float32))
    one_b = b.const(np.ones(3, dtype=np.float32))
    two = b.const(np.full(3, 2.0, dtype=np.float32))
    y = b.emit("add", [b.emit("mul", [x, one_a]), b.emit("mul", [x, one_b])])
    g.outputs = [b.emit("add", [y, b.emit("mul", [x, two])])]
    before = g.copy()
    result = CommonSubexpressionPass().call(g)
    assert result.changed
    assert result.graph.op_counts() == {"add": 2, "mul": 2}
    assert len(result.graph.constants) == 2
    assert_same_outputs(before, result.graph)


def test_a_duplicate_that_is_a_graph_output_stays() -> None:
    g, b, x = graph_with_input((3,))
    first, second = b.emit("exp", [x]), b.emit("exp", [x])
    g.outputs = [first, second]
    result = CommonSubexpressionPass().call(g)
    assert len(result.graph.nodes) == 2 and result.graph.outputs == [first, second]


def test_different_attributes_are_not_merged() -> None:
    g, b, x = graph_with_input((2, 3))
    g.outputs = [b.emit("add", [b.emit("reduce_sum", [x], axes=[0], keepdims=True),
                                b.emit("reduce_sum", [x], axes=[1], keepdims=True)])]
    result = CommonSubexpressionPass().call(g)
    assert not result.changed and result.graph.op_counts()["reduce_sum"] == 2
