"""Control-flow ops as ONNX If, Loop and Scan, their bodies emitted by the same translators as any partition.

ONNX bodies read the enclosing graph's values by name while ours are closed graphs bound by position, so
each body is emitted under a unique prefix with an Identity per input from the value the node passes, and
an Identity per output (a body may return an input, or one value twice). Body weights are serialised into
the body graph as initializers. A while_loop's condition runs once before the Loop (ONNX tests its `cond`
input before the first trip) and again at the end of each trip, after the body.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgerun.backends.base import OpSupport
from edgerun.backends.onnxruntime.onnx_llm_ops import LLM_TRANSLATORS
from edgerun.backends.onnxruntime.onnx_ops import ONNX_DTYPE, TRANSLATORS, OnnxBuilder, Translator
from edgerun.backends.onnxruntime.onnx_quant_ops import QUANT_TRANSLATORS
from edgerun.backends.onnxruntime.onnx_raster import emit_raster
from edgerun.ir.graph import Graph, Node
from edgerun.ir.subgraphs import bodies_of, has_every_body

# A cond with a left-out branch (ir/ops/control_flow_ops.py) stays on the reference, whose error names it.
CONTROL_FLOW = {"cond": OpSupport(check=lambda node, graph: has_every_body(node)), "while_loop": OpSupport(),
                "scan": OpSupport()}
# Every translator the backend emits with, each module's table joined here, once: the atomic ops and the
# composites ORT keeps whole (onnx_ops), the integer ops (onnx_quant_ops), the decoder's ops (onnx_llm_ops).
TRANSLATORS_ALL: dict[str, Translator] = {**TRANSLATORS, **QUANT_TRANSLATORS, **LLM_TRANSLATORS}


class _BodyBuilder(OnnxBuilder):
    """An OnnxBuilder whose made-up names carry a prefix, so a body's never meet its parent's."""

    def __init__(self, graph: Graph, prefix: str) -> None:
        super().__init__(graph)
        self.prefix = prefix

    def fresh(self, hint: str) -> str:
        return self.prefix + super().fresh(hint)


def emit_node(b: OnnxBuilder, node: Node) -> None:
    """Append the ONNX form of any node the delegate claims (atomic, raster, kept composite, control flow)."""
    if node.op == "raster":
        emit_raster(b, node)
    elif node.op in CONTROL_FLOW:
        emit_control_flow(b, node)
    else:
        TRANSLATORS_ALL[node.op](b, node)


def emit_control_flow(b: OnnxBuilder, node: Node) -> None:
    bodies = bodies_of(node, b.graph)
    prefix = f"{node.name}/"  # a body's node names already carry their body's prefix
    if node.op == "cond":
        branches = [_branch_graph(b, body, f"{prefix}{side}/", node.inputs[1:])
                    for body, side in zip(bodies, ("then", "else"))]
        pred = b.node("Reshape", [node.inputs[0], b.ints([], "scalar")])
        b.node("If", [pred], list(node.outputs), then_branch=branches[0], else_branch=branches[1])
    elif node.op == "while_loop":
        _emit_while(b, node, bodies[0], bodies[1], prefix)
    else:
        _emit_scan(b, node, bodies[0], prefix)


def _emit_body(b: OnnxBuilder, body: Graph, prefix: str, bind: Sequence[str]) -> tuple[list[Any], list[Any], list[str]]:
    """(nodes, initializers, output names) of `body` with its inputs read from the names in `bind`."""
    child = _BodyBuilder(_prefixed(body, prefix), prefix)
    for outer, inner in zip(bind, child.graph.inputs):
        child.node("Identity", [outer], [inner])
    for inner_node in child.graph.nodes:
        emit_node(child, inner_node)
    outs = [child.node("Identity", [v], [f"{prefix}out{j}"]) for j, v in enumerate(child.graph.outputs)]
    inits = list(child.initializers)
    # Large made-up constants go to the top-level model as external OrtValues; a body serialises its own.
    inits += [b.numpy_helper.from_array(np.array(value, order="C"), name) for name, value in child.large.items()]
    inits += [b.numpy_helper.from_array(np.array(value, order="C"), name)  # ascontiguousarray makes 0-d 1-d
              for name, value in child.graph.constants.items()]
    return child.nodes, inits, outs


def _branch_graph(b: OnnxBuilder, body: Graph, prefix: str, bind: Sequence[str],
                  inputs: Sequence[Any] = (), extra_outputs: Sequence[Any] = ()) -> Any:
    nodes, inits, outs = _emit_body(b, body, prefix, bind)
    infos = [_info(b, name, body.specs[v]) for name, v in zip(outs, body.outputs)]
    return b.helper.make_graph(nodes, prefix.rstrip("/").replace("/", "_"), list(inputs),
                               [*extra_outputs, *infos], inits)


def _emit_while(b: OnnxBuilder, node: Node, cond: Graph, body: Graph, prefix: str) -> None:
    k = int(node.attrs["num_carried"])
    carried, invariants = list(node.inputs[:k]), list(node.inputs[k:])
    scalar = b.ints([], "scalar")
    # The first test, outside the loop.
    nodes, inits, (first,) = _emit_body(b, cond, f"{prefix}cond0/", [*carried, *invariants])
    b.nodes += nodes
    b.initializers += inits
    first = b.node("Reshape", [first, scalar])
    # One trip: the body, then the test for the next trip.
    state = [f"{prefix}state{j}" for j in range(k)]
    body_nodes, body_inits, new_state = _emit_body(b, body, f"{prefix}body/", [*state, *invariants])
    test_nodes, test_inits, (again,) = _emit_body(b, cond, f"{prefix}cond/", [*new_state, *invariants])
    trip_scalar = b.numpy_helper.from_array(np.zeros(0, np.int64), f"{prefix}scalar")
    again_out = f"{prefix}again"
    nodes = [*body_nodes, *test_nodes, b.helper.make_node("Reshape", [again, trip_scalar.name], [again_out])]
    specs = [body.specs[v] for v in body.outputs]
    graph = b.helper.make_graph(
        nodes, f"{prefix}loop".replace("/", "_"),
        [b.helper.make_tensor_value_info(f"{prefix}trip", 7, []),
         b.helper.make_tensor_value_info(f"{prefix}keep_going", 9, []),
         *(_info(b, name, spec) for name, spec in zip(state, specs))],
        [b.helper.make_tensor_value_info(again_out, 9, []),
         *(_info(b, name, spec) for name, spec in zip(new_state, specs))],
        [*body_inits, *test_inits, trip_scalar])
    b.node("Loop", ["", first, *carried], list(node.outputs), body=graph)


def _emit_scan(b: OnnxBuilder, node: Node, body: Graph, prefix: str) -> None:
    k, m = int(node.attrs["num_carried"]), int(node.attrs["num_sequences"])
    carried, sequences, invariants = node.inputs[:k], node.inputs[k:k + m], node.inputs[k + m:]
    if not sequences:  # ONNX Scan needs a sequence to count its steps: give it one of the right length
        length = int(node.attrs["length"])
        sequences = [b.const(np.zeros((length, 1), np.float32), "steps")]
        body_inputs = [*body.inputs[:k], None, *body.inputs[k:]]
    else:
        body_inputs = list(body.inputs)
    names = [f"{prefix}in{j}" for j in range(len(body_inputs))]
    formal = [(name, v) for name, v in zip(names, body_inputs)][:k + len(sequences)]
    bind = [name for name, v in zip(names, body_inputs) if v is not None][:k + m] + list(invariants)
    inputs = [b.helper.make_tensor_value_info(name, 1, [1]) if v is None else _info(b, name, body.specs[v])
              for name, v in formal]
    graph = _branch_graph(b, body, f"{prefix}body/", bind, inputs)
    b.node("Scan", [*carried, *sequences], list(node.outputs), body=graph, num_scan_inputs=len(sequences))


def _info(b: OnnxBuilder, name: str, spec: Any) -> Any:
    return b.helper.make_tensor_value_info(name, ONNX_DTYPE[spec.dtype], list(spec.shape))


def _prefixed(graph: Graph, prefix: str) -> Graph:
    """A copy of `graph` with every value name prefixed (bodies keep theirs: they are emitted on their own)."""
    def p(v: str) -> str:
        return prefix + v if v else v
    nodes = [Node(n.op, [p(i) for i in n.inputs], [p(o) for o in n.outputs], dict(n.attrs), dict(n.meta),
                  prefix + n.name) for n in graph.nodes]
    return Graph([p(v) for v in graph.inputs], [p(v) for v in graph.outputs], nodes,
                 {p(v): s for v, s in graph.specs.items()}, {p(v): a for v, a in graph.constants.items()},
                 subgraphs=dict(graph.subgraphs))
