"""DecomposePass: replace every composite op by its registered decomposition, until only atomic ops and raster remain."""

from __future__ import annotations

from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.registry import OpKind, get_op
from edgerun.passes.base import Pass, PassResult

_MAX_ROUNDS = 16  # decompositions may emit composites (split -> slice); nesting is shallow


class DecomposePass(Pass):
    """Lower composite ops to atomic ops and raster."""

    name = "decompose"

    def call(self, graph: Graph) -> PassResult:
        changed = False
        for _ in range(_MAX_ROUNDS):
            if not self._one_round(graph):
                break
            changed = True
        else:
            raise RuntimeError("decomposition did not converge; a decomposition emits its own op")
        graph.prune_specs()
        return PassResult(graph, changed)

    @staticmethod
    def _one_round(graph: Graph) -> bool:
        old_nodes = graph.nodes
        graph.nodes = []
        rename: dict[str, str] = {}
        changed = False
        for node in old_nodes:
            node.inputs = [rename.get(i, i) for i in node.inputs]
            opdef = get_op(node.op)
            if opdef.kind is not OpKind.COMPOSITE:
                graph.nodes.append(node)
                continue
            changed = True
            assert opdef.decompose is not None
            outs = opdef.decompose(Builder(graph, node.meta), list(node.inputs), node.attrs)
            if len(outs) != len(node.outputs):
                raise RuntimeError(f"decomposition of {node.op} returned {len(outs)} values, "
                                   f"expected {len(node.outputs)}")
            for old, new in zip(node.outputs, outs):
                if graph.specs[old] != graph.specs[new]:
                    raise RuntimeError(f"decomposition of {node.op} changed {graph.specs[old]} "
                                       f"to {graph.specs[new]}")
                rename[old] = new
        graph.outputs = [rename.get(o, o) for o in graph.outputs]
        return changed
