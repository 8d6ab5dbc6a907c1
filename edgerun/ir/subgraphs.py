"""Subgraphs: the bodies of control-flow nodes (cond, while_loop, scan), held in `Graph.subgraphs`.

A body is a closed Graph: everything it reads is one of its own inputs or constants, never a value of the
graph around it, so every pass, the verifier and the oracle treat a body as a graph of its own, and a body
binds to its node positionally (the node's inputs to the body's inputs, the body's outputs to the node's
results). A node names its bodies by attrs (`OpDef.bodies`: cond's `then`/`else`, while_loop's
`cond`/`body`, scan's `body`); the names are keys of the `subgraphs` of the graph holding the node, so a body
may hold control flow of its own.

In a program file the weights of every body sit in the one segment table, under a qualified name:
`<subgraph>::<constant>` (nested: `outer::inner::w`). A top-level constant whose own name looks qualified
wins; the writer refuses a name two constants would share.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from edgerun.errors import VerificationError
from edgerun.ir.graph import Graph, Node
from edgerun.ir.registry import OpKind, get_op
from edgerun.ir.tensor_spec import TensorSpec

QUALIFIER = "::"


def is_control_flow(op: str) -> bool:
    return get_op(op).kind is OpKind.CONTROL_FLOW


def body_names(node: Node) -> list[str]:
    """The subgraph names `node` refers to, in its op's body order (none for an ordinary op). A cond branch
    that cannot run at the graph's shapes has no body (its attr is "", see control_flow_ops.py)."""
    return [node.attrs[key] for key in get_op(node.op).bodies if node.attrs[key] != ""]


def has_every_body(node: Node) -> bool:
    """False for a cond with a branch that cannot run at these shapes (taking it is a run-time error)."""
    return all(node.attrs[key] != "" for key in get_op(node.op).bodies)


def bodies_of(node: Node, graph: Graph) -> list[Graph]:
    """The bodies of control-flow `node` (in its op's order, absent branches left out), looked up in `graph`,
    the graph holding it."""
    try:
        return [graph.subgraphs[name] for name in body_names(node)]
    except KeyError as exc:
        raise VerificationError(f"node {node.name!r} ({node.op}) names subgraph {exc.args[0]!r}, "
                                "which its graph does not have") from None


def add_subgraph(graph: Graph, body: Graph, hint: str = "body") -> str:
    """Store `body` in `graph.subgraphs` under a fresh name; returns the name."""
    k = len(graph.subgraphs)
    while f"{hint}_{k}" in graph.subgraphs:
        k += 1
    name = f"{hint}_{k}"
    graph.subgraphs[name] = body
    return name


def nested_graphs(graph: Graph) -> Iterator[Graph]:
    """`graph` and every body inside it, outermost first."""
    yield graph
    for body in graph.subgraphs.values():
        yield from nested_graphs(body)


def transform_bodies(graph: Graph, rewrite: Callable[[Graph], Graph]) -> None:
    """Replace every body (at every depth) by `rewrite(body)`, innermost bodies first."""
    for name, body in list(graph.subgraphs.items()):
        transform_bodies(body, rewrite)
        graph.subgraphs[name] = rewrite(body)


def prune_subgraphs(graph: Graph) -> bool:
    """Drop the bodies no node names any more (at every depth); True when any went."""
    named = {b for n in graph.nodes if is_control_flow(n.op) for b in body_names(n)}
    dead = [name for name in graph.subgraphs if name not in named]
    for name in dead:
        del graph.subgraphs[name]
    changed = bool(dead)
    for body in graph.subgraphs.values():
        changed |= prune_subgraphs(body)
    return changed


# -- the weights of bodies, under qualified names (the program file's one segment table) ----------------------
def flat_constants(graph: Graph) -> dict[str, np.ndarray]:
    """Every constant of `graph` and its bodies, the bodies' under qualified names."""
    return {name: graph_.constants[local] for name, (graph_, local) in _flat(graph).items()}


def flat_constant_specs(graph: Graph) -> dict[str, TensorSpec]:
    return {name: graph_.specs[local] for name, (graph_, local) in _flat(graph).items()}


def _flat(graph: Graph, prefix: str = "") -> dict[str, tuple[Graph, str]]:
    found = {prefix + name: (graph, name) for name in graph.constants}
    for sub, body in graph.subgraphs.items():
        for name, where in _flat(body, f"{prefix}{sub}{QUALIFIER}").items():
            if name in found:
                raise VerificationError(f"constant name {name!r} is used by two constants (one in a subgraph)")
            found[name] = where
    return found


def constant_home(graph: Graph, qualified: str) -> tuple[Graph, str] | None:
    """(the graph that declares constant `qualified`, its local name), or None when no graph declares it."""
    if qualified in graph.specs:
        return graph, qualified
    sub, sep, rest = qualified.partition(QUALIFIER)
    if sep and sub in graph.subgraphs:
        return constant_home(graph.subgraphs[sub], rest)
    return None


def inline_body(graph: Graph, body: Graph, args: list[str], results: list[str], hint: str) -> None:
    """Append `body`'s nodes to `graph`, reading `args` for its inputs and defining `results` for its outputs
    (values it defines get fresh names from `hint`; its constants and bodies are copied in)."""
    rename = dict(zip(body.inputs, args))
    for name, array in body.constants.items():
        rename[name] = graph.add_constant(array, hint=f"{hint}_const")
    outputs = dict(zip(body.outputs, results))
    pending: list[tuple[str, str]] = []  # (result, body value) where a result is an input or constant
    for out, value in zip(results, body.outputs):
        if value in rename or body.outputs.count(value) > 1:
            pending.append((out, value))
            outputs.pop(value, None)
    renamed_bodies = {k: add_subgraph(graph, sub, f"{hint}_{k}") for k, sub in body.subgraphs.items()}
    for node in body.nodes:
        for out in node.outputs:
            rename[out] = outputs.get(out) or graph.fresh_name(hint)
            graph.specs[rename[out]] = body.specs[out]
        attrs = dict(node.attrs)
        for key in get_op(node.op).bodies:
            if attrs[key]:
                attrs[key] = renamed_bodies[attrs[key]]
        graph.nodes.append(Node(node.op, [rename.get(i, i) for i in node.inputs], [rename[o] for o in node.outputs],
                                attrs, dict(node.meta), name=rename[node.outputs[0]] if node.outputs else hint))
    for out, value in pending:  # a result that is an input or constant of the body: a copy keeps it a node
        spec = body.specs[value]
        graph.specs[out] = spec
        graph.nodes.append(Node("raster", [rename[value]], [out], _identity_raster(spec), name=out))


def _identity_raster(spec: TensorSpec) -> dict[str, object]:
    from edgerun.ir.ops.raster import strided_copy_regions
    from edgerun.ir.tensor_spec import contiguous_strides
    strides = contiguous_strides(spec.shape)
    return {"regions": strided_copy_regions(0, 0, strides, 0, strides, spec.shape), "shape": list(spec.shape),
            "fill": None}
