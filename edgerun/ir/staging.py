"""Programs with data-dependent output sizes run in stages, split at each data-dependent node.

A node such as `nonzero` (ops/data_dependent_ops.py) gives an output whose extent is a symbol no input
shape binds: it is known once the node has run. The design keeps everything else as it is (a template is
specialised per concrete shape, docs/design.md) by splitting the graph at the first such node:

    prefix  every node before it: an ordinary template over the input symbols
    node    the data-dependent node, run on its reference kernel with the prefix's values
    suffix  every node after it: a template whose inputs are the program's inputs, the prefix values it
            reads and the node's outputs, so the node's extent symbol is bound from an input shape

A suffix holding another data-dependent node is split again when it runs. Each stage is planned and placed
exactly for the shapes it sees, so no memory is planned for an upper bound, and no backend needs a kernel for
a data-dependent op. Control-flow bodies may not hold one (a body is planned once for its node).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgerun.errors import VerificationError
from edgerun.ir.graph import Graph, Node
from edgerun.ir.registry import OpKind, get_op


def is_data_dependent(op: str) -> bool:
    return get_op(op).kind is OpKind.DATA_DEPENDENT


def has_data_dependent(graph: Graph) -> bool:
    """Whether the graph (top level) holds a node whose output extent is known only at run time."""
    return any(is_data_dependent(n.op) for n in graph.nodes)


def runtime_symbols(graph: Graph) -> set[str]:
    """The symbols bound by data-dependent nodes at run time, not by input shapes. Attr `extent` names one
    symbol, or a list of them where a node has several run-time sizes (image_decode: height and width)."""
    names: set[str] = set()
    for n in graph.nodes:
        if is_data_dependent(n.op):
            extent = n.attrs["extent"]
            names.update(str(e) for e in (extent if isinstance(extent, list) else [extent]))
    return names


def new_extent_symbol(graph: Graph, hint: str, upper: int) -> str:
    """Declare a fresh symbol for a data-dependent size within [0, upper] and return its name."""
    k = 0
    while f"{hint}{k}" in graph.symbols:
        k += 1
    name = f"{hint}{k}"
    graph.symbols[name] = (0, int(upper))
    return name


@dataclass
class Stages:
    prefix: Graph  # the nodes before `node` (may have none); its outputs are what the rest reads of them
    node: Node  # the first data-dependent node
    suffix: Graph  # everything after; inputs: the program's, then the prefix outputs, then the node's outputs


def split_at_data_dependent(graph: Graph) -> Stages:
    """Split a graph (top level, in topological order) at its first data-dependent node."""
    if graph.state_inputs or graph.state_updates:
        raise VerificationError("a program with state cannot hold a data-dependent op (nonzero, unique, ...): "
                                "its state updates would be split across stages")
    index = next(i for i, n in enumerate(graph.nodes) if is_data_dependent(n.op))
    node, before, after = graph.nodes[index], graph.nodes[:index], graph.nodes[index + 1:]
    late = runtime_symbols(graph)
    made_before = [o for n in before for o in n.outputs]
    read_later = {i for n in [node, *after] for i in n.inputs if i} | set(graph.outputs)
    carried = list(dict.fromkeys(v for v in made_before if v in read_later))

    prefix = _stage(graph, list(graph.inputs), before, carried)
    prefix.symbols = {k: v for k, v in graph.symbols.items() if k not in late}
    suffix_inputs = list(dict.fromkeys([*graph.inputs, *carried, *node.outputs]))
    suffix = _stage(graph, suffix_inputs, after, list(graph.outputs))
    suffix.symbols = dict(graph.symbols)
    return Stages(prefix, node, suffix)


def _stage(graph: Graph, inputs: list[str], nodes: list[Node], outputs: list[str]) -> Graph:
    used = set(inputs) | set(outputs) | {i for n in nodes for i in n.inputs if i} | {o for n in nodes
                                                                                      for o in n.outputs}
    stage = Graph(inputs=list(inputs), outputs=list(outputs), nodes=[Node(n.op, list(n.inputs), list(n.outputs),
                                                                          dict(n.attrs), dict(n.meta), n.name)
                                                                     for n in nodes])
    stage.specs = {k: v for k, v in graph.specs.items() if k in used}
    stage.constants = {k: v for k, v in graph.constants.items() if k in used and k not in inputs}
    bodies = {str(v) for n in nodes for v in n.attrs.values() if isinstance(v, str) and v in graph.subgraphs}
    stage.subgraphs = {k: graph.subgraphs[k] for k in bodies}
    return stage
