"""DeadCodePass: unused nodes, constants and specs go; everything that reaches an output stays."""

from __future__ import annotations

import numpy as np
from passes_testkit import assert_same_outputs, graph_with_input

from edgerun.passes.dead_code_pass import DeadCodePass


def test_unused_chain_and_its_constants_are_removed() -> None:
    g, b, x = graph_with_input((3,))
    kept = b.emit("exp", [x])
    dead = b.emit("mul", [b.emit("neg", [x]), b.const(np.ones(3, dtype=np.float32))])
    g.outputs = [kept]
    before = g.copy()
    result = DeadCodePass().call(g)
    assert result.changed
    assert [n.op for n in result.graph.nodes] == ["exp"]
    assert not result.graph.constants and dead not in result.graph.specs
    assert_same_outputs(before, result.graph)


def test_multi_output_node_stays_while_one_output_is_used() -> None:
    g, b, x = graph_with_input((4, 2))
    first, _ = b.emit_multi("split", [x], axis=0, sizes=[1, 3])
    g.outputs = [first]
    result = DeadCodePass().call(g)
    assert [n.op for n in result.graph.nodes] == ["split"]


def test_graph_without_dead_code_is_unchanged() -> None:
    g, b, x = graph_with_input((3,))
    g.outputs = [b.emit("exp", [x])]
    result = DeadCodePass().call(g)
    assert not result.changed and len(result.graph.nodes) == 1
