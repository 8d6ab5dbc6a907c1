"""DeadCodePass: remove nodes nothing reads, then the constants and specs they leave behind."""

from __future__ import annotations

from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import prune_subgraphs
from edgerun.passes.base import Pass, PassResult


def remove_dead_nodes(graph: Graph) -> bool:
    """Drop every node none of whose outputs is read or is a graph output; True when any went.

    Every op in the IR is pure, so a node whose results are unused can go without changing anything.
    """
    live = set(graph.outputs) | set(graph.state_updates.values())  # a state's update is a result too
    kept = []
    for node in reversed(graph.nodes):
        if any(o in live for o in node.outputs):
            kept.append(node)
            live.update(i for i in node.inputs if i)
    changed = len(kept) != len(graph.nodes)
    graph.nodes = kept[::-1]
    return changed


class DeadCodePass(Pass):
    """Remove unused nodes, constants and specs."""

    name = "dead_code"

    def call(self, graph: Graph) -> PassResult:
        constants, specs = len(graph.constants), len(graph.specs)
        changed = remove_dead_nodes(graph)
        changed |= prune_subgraphs(graph)  # bodies of the control-flow nodes that went
        graph.prune_specs()
        changed |= len(graph.constants) != constants or len(graph.specs) != specs
        return PassResult(graph, changed)
