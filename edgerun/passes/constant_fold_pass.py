"""ConstantFoldPass: evaluate nodes whose inputs are all constants with the oracle's kernels (edgerun.oracle).

Size rule: a node is folded only when its result is no larger than the constant bytes the fold frees (inputs
that nothing else reads) plus `SMALL_CONSTANT_BYTES`. So a transpose of a weight is folded (the program
stores it pre-transposed, same size), the batch-norm statistics chain collapses into two per-channel
vectors, but an `expand` of a scalar to an activation-sized tensor stays a node, and a weight read twice
(tied embeddings) is not duplicated.
"""

from __future__ import annotations

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph, Node
from edgerun.ir.registry import OpKind, get_op
from edgerun.ir.subgraphs import inline_body
from edgerun.oracle import run_node
from edgerun.passes.base import Pass, PassResult

# Below this a constant costs less than the node that would compute it at run time.
SMALL_CONSTANT_BYTES = 4096


class ConstantFoldPass(Pass):
    """Replace nodes whose inputs are all constants by constants, within a weight-size budget."""

    name = "constant_fold"

    def __init__(self, small_constant_bytes: int = SMALL_CONSTANT_BYTES) -> None:
        self.small_constant_bytes = small_constant_bytes

    def call(self, graph: Graph) -> PassResult:
        readers: dict[str, int] = {}
        for node in graph.nodes:
            for i in node.inputs:
                if i:
                    readers[i] = readers.get(i, 0) + 1
        kept: list[Node] = []
        changed = False
        for node in graph.nodes:
            values = self._fold(graph, node, readers)
            if values is None:
                kept.append(node)
                continue
            for i in node.inputs:
                if i:
                    readers[i] -= 1
            for name, value in zip(node.outputs, values):
                graph.constants[name] = value
            changed = True
        graph.nodes = kept
        changed |= inline_decided_conds(graph)
        graph.prune_specs()
        return PassResult(graph, changed)

    def _fold(self, graph: Graph, node: Node, readers: dict[str, int]) -> list[np.ndarray] | None:
        inputs = [i for i in node.inputs if i]
        if not inputs or any(i not in graph.constants for i in inputs):
            return None
        if get_op(node.op).kind is OpKind.COMPOSITE or any(o in graph.outputs for o in node.outputs):
            return None  # composites fold after decomposition; outputs stay node results for the runtime
        freed = sum(int(graph.constants[i].nbytes) for i in set(inputs)
                    if readers.get(i, 0) == inputs.count(i) and i not in graph.outputs)
        made = sum(graph.specs[o].nbytes for o in node.outputs)
        if made > freed + self.small_constant_bytes:
            return None
        try:
            values = run_node(node, [graph.constants[i] for i in inputs], graph)
        except (EdgerunError, ArithmeticError, ValueError):
            return None  # leave the failure to run time, where it is reported against real inputs
        return values


def inline_decided_conds(graph: Graph) -> bool:
    """Replace each cond whose predicate is a constant by the branch it takes; True when any was."""
    conds = [n for n in graph.nodes if n.op == "cond" and n.inputs[0] in graph.constants]
    if not conds:
        return False
    nodes, graph.nodes = graph.nodes, []
    for node in nodes:
        if node not in conds:
            graph.nodes.append(node)
            continue
        side = "then" if bool(np.asarray(graph.constants[node.inputs[0]]).reshape(-1)[0]) else "else"
        if not node.attrs[side]:  # a left-out branch: its run-time error stays the node's
            graph.nodes.append(node)
            continue
        inline_body(graph, graph.subgraphs[node.attrs[side]], node.inputs[1:], node.outputs, node.name)
    return True
