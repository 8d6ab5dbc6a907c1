"""Decomposition: replace composite ops by their registered decompositions, beside the ops that define them.

A composite's decomposition is its semantics (registry.py), so lowering is a property of the IR, not a pass
of its own: the pass pipeline, the oracle and the runtime all call `decompose`. `keep` names the composites
to leave whole: at load time a backend that implements a composite claims it (Backend.keeps_whole) and the
runtime decomposes everything else. Bodies of control-flow nodes (Graph.subgraphs) are lowered too, with the
same `keep`, unless `bodies=False` (the runtime's after-placement lowering: a control-flow node's backend
runs its bodies whole, or the oracle lowers them when it runs them).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph, Node
from edgerun.ir.ops.raster import strided_copy_regions
from edgerun.ir.registry import OpKind, get_op
from edgerun.ir.tensor_spec import contiguous_strides

MAX_ROUNDS = 16  # decompositions may emit composites (split -> slice); nesting is shallow

KeepWhole = Callable[[Node, Graph], bool]  # (node, the graph it is in) -> leave it whole


def decompose(graph: Graph, keep: KeepWhole | None = None, origins: dict[str, str] | None = None,
              bodies: bool = True) -> bool:
    """Lower, in place, every composite node `keep` does not claim; True when anything changed.

    `origins`, when given, receives new node name -> name of the original node it was lowered from (the
    runtime places each piece where its composite was placed).
    """
    changed = False
    for _ in range(MAX_ROUNDS):
        if not _one_round(graph, keep, origins):
            break
        changed = True
    else:
        raise RuntimeError("decomposition did not converge; a decomposition emits its own op")
    graph.prune_specs()
    if bodies:
        for body in graph.subgraphs.values():
            changed |= decompose(body, keep)
    return changed


def has_composites(graph: Graph, keep: KeepWhole | None = None, bodies: bool = True) -> bool:
    return any(get_op(n.op).kind is OpKind.COMPOSITE and not (keep and keep(n, graph)) for n in graph.nodes) \
        or (bodies and any(has_composites(body, keep) for body in graph.subgraphs.values()))


def restore_output_names(graph: Graph, names: Sequence[str]) -> None:
    """Give graph outputs back the names in `names` where that name is free.

    A node's result or a constant is renamed everywhere it is read; a graph input that became an output
    (an identity model, or a reshape that decomposed to nothing) keeps its name and gets a copy under the
    output's name, and so does a value listed more than once among the outputs, for all but its last place.
    """
    producers = graph.producers()
    for position, (current, wanted) in enumerate(zip(list(graph.outputs), names)):
        if current == wanted or wanted in graph.specs:
            continue
        if current in graph.inputs or graph.outputs.count(current) > 1:
            spec = graph.specs[current]
            strides = contiguous_strides(spec.shape)
            regions = strided_copy_regions(0, 0, strides, 0, strides, spec.shape)
            graph.nodes.append(Node("raster", [current], [wanted],
                                    {"regions": regions, "shape": list(spec.shape), "fill": None}, name=wanted))
            graph.specs[wanted] = spec
            graph.outputs[position] = wanted
            continue
        if current in producers:
            node = producers[current]
            node.outputs = [wanted if o == current else o for o in node.outputs]
        else:
            graph.constants[wanted] = graph.constants.pop(current)
        for n in graph.nodes:
            n.inputs = [wanted if i == current else i for i in n.inputs]
        graph.specs[wanted] = graph.specs.pop(current)
        graph.outputs[position] = wanted


def decomposed(graph: Graph, keep: KeepWhole | None = None, origins: dict[str, str] | None = None,
               bodies: bool = True) -> Graph:
    """A copy of `graph` with composites lowered (those `keep` claims excepted) and output names kept."""
    if not has_composites(graph, keep, bodies):
        return graph
    names = list(graph.outputs)
    copy = graph.copy()
    decompose(copy, keep, origins, bodies)
    restore_output_names(copy, names)
    return copy


def _one_round(graph: Graph, keep: KeepWhole | None, origins: dict[str, str] | None) -> bool:
    old_nodes = graph.nodes
    graph.nodes = []
    rename: dict[str, str] = {}
    changed = False
    for node in old_nodes:
        node.inputs = [rename.get(i, i) for i in node.inputs]
        opdef = get_op(node.op)
        if opdef.kind is not OpKind.COMPOSITE or (keep is not None and keep(node, graph)):
            graph.nodes.append(node)
            continue
        changed = True
        assert opdef.decompose is not None
        first_new = len(graph.nodes)
        outs = opdef.decompose(Builder(graph, node.meta), list(node.inputs), node.attrs)
        if origins is not None:
            root = origins.get(node.name, node.name)
            for piece in graph.nodes[first_new:]:
                origins[piece.name] = root
        if len(outs) != len(node.outputs):
            raise RuntimeError(f"decomposition of {node.op} returned {len(outs)} values, "
                               f"expected {len(node.outputs)}")
        taken: dict[str, str] = {}  # a piece's result already renamed to an earlier output of this node
        for old, new in zip(node.outputs, outs):
            if new in taken:
                rename[old] = taken[new]
                continue
            if graph.specs[old] != graph.specs[new]:
                raise RuntimeError(f"decomposition of {node.op} changed {graph.specs[old]} "
                                   f"to {graph.specs[new]}")
            pieces = graph.nodes[first_new:]
            if any(new in piece.outputs for piece in pieces):
                # The piece that computes the composite's result takes its name, so a value keeps its name
                # through lowering (hooks, calibration and the developer tools look values up by name).
                for piece in pieces:
                    piece.inputs = [old if i == new else i for i in piece.inputs]
                    piece.outputs = [old if o == new else o for o in piece.outputs]
                del graph.specs[new]
                taken[new] = old
            else:
                rename[old] = new  # the result is an existing value (an input or a constant passed through)
    graph.outputs = [rename.get(o, o) for o in graph.outputs]
    return changed
