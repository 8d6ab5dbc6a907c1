"""Reverse-mode differentiation of an IR graph: the backward graph appended as ordinary IR.

`append_gradients(graph, loss, wrt)` lowers the composites that have no gradient rule of their own
(registry.gradient_rule: softmax, log-softmax, layer norm and relu keep theirs), then walks the nodes from
the loss back to the values in `wrt`, calling each op's vector-Jacobian product (written beside the op, in
ir/ops/*) and summing the cotangents of values read more than once. Only nodes on a path from a value in
`wrt` to the loss are differentiated; a value of integer or bool type carries no gradient (an argmax, a
comparison, a cast to int ends a path, as in torch). A path through an op with no gradient (a quantized op,
control flow, a data-dependent op) is a NoGradientError naming the node.

What backward keeps: the rules read forward values (a node's inputs or outputs) directly, so the backward
graph holds on to exactly the activations some rule reads, and the memory plan frees every other one after
its last forward use. Because the result is one ordinary graph, every backend runs it and every pass
(decomposition, folding, raster merging, dead code) and the memory planner treat it like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.decompose import decompose, restore_output_names
from edgerun.ir.graph import Graph, Node
from edgerun.ir.registry import NoGradientError, gradient_rule, no_gradient_reason


def _is_float(graph: Graph, value: str) -> bool:
    return bool(value) and graph.specs[value].dtype.is_float


def _where(node: Node) -> str:
    source = node.meta.get("source") or node.meta.get("module_path")
    return f" at {source}" if source else ""


def append_gradients(graph: Graph, loss: str, wrt: Sequence[str]) -> dict[str, str]:
    """Append, in place, nodes computing d(loss)/d(v) for each v in `wrt`; returns v -> its gradient's value.

    `loss` must be a float value with one element; each `wrt` a float input, constant or state value of the
    graph. A value the loss does not depend on gets a zero gradient. Composites without a gradient rule of
    their own are lowered first (graph outputs keep their names).
    """
    if loss not in graph.specs:
        raise EdgerunError(f"the loss {loss!r} is not a value of the graph")
    spec = graph.specs[loss]
    if not spec.dtype.is_float or spec.numel != 1:
        raise EdgerunError(f"the loss must be a float scalar, {loss!r} is {spec}")
    for name in wrt:
        if name not in graph.specs:
            raise EdgerunError(f"cannot differentiate with respect to {name!r}: the graph has no such value")
        if not graph.specs[name].dtype.is_float:
            raise EdgerunError(f"cannot differentiate with respect to {name!r}: it is {graph.specs[name]}, "
                               "not a float tensor")
    added = loss not in graph.outputs
    if added:
        graph.outputs.append(loss)
    position = graph.outputs.index(loss)
    names = list(graph.outputs)
    decompose(graph, keep=lambda node, _: gradient_rule(node.op) is not None)
    restore_output_names(graph, names)
    loss = graph.outputs[position]
    if added:
        graph.outputs.pop(position)

    forward = list(graph.nodes)
    active = set(wrt)
    for node in forward:
        if any(i in active for i in node.inputs if i):
            active.update(o for o in node.outputs if _is_float(graph, o))
    needed = {loss}
    for node in reversed(forward):
        if any(o in needed for o in node.outputs):
            needed.update(i for i in node.inputs if i)
    relevant = active & needed

    b = Builder(graph)
    cotangents: dict[str, str] = {}
    if loss in relevant:
        cotangents[loss] = b.const(np.ones(spec.shape, spec.dtype.np), spec.dtype, hint="d_loss")
    for node in reversed(forward):
        grads = [cotangents.get(o) for o in node.outputs]
        if all(g is None for g in grads):
            continue
        needs = [bool(i) and i in relevant and _is_float(graph, i) for i in node.inputs]
        if not any(needs):
            continue
        rule = gradient_rule(node.op)
        if rule is None:
            raise NoGradientError(f"cannot differentiate {loss!r}: node {node.name!r} ({node.op}{_where(node)}) "
                                  f"lies between it and the trained values and has no gradient: "
                                  f"{no_gradient_reason(node.op)}")
        b.meta = {**node.meta, "gradient_of": node.name}
        for value, g in zip(node.inputs, rule(b, node, grads, needs)):
            if g is None or not value or value not in relevant:
                continue
            if graph.specs[g] != graph.specs[value]:
                raise EdgerunError(f"the gradient rule of {node.op} gave {graph.specs[g]} for {value!r}, which is "
                                   f"{graph.specs[value]}")
            cotangents[value] = b.binary("add", cotangents[value], g) if value in cotangents else g
    b.meta = {}
    result = {}
    for name in wrt:
        if name in cotangents:
            result[name] = cotangents[name]
        else:
            zero = b.scalar(0.0, name)
            shape = graph.specs[name].shape
            result[name] = b.emit("expand", [zero], shape=list(shape)) if shape else zero
    return result


def activations_kept(graph: Graph, forward_nodes: int) -> tuple[int, int]:
    """(bytes of the forward's activations that backward reads, bytes of all the forward's activations) of a
    graph whose first `forward_nodes` nodes are the forward and the rest backward: what a plan keeps alive
    for backward, beside a tape that keeps every activation."""
    produced = {o for n in graph.nodes[:forward_nodes] for o in n.outputs}
    read = {i for n in graph.nodes[forward_nodes:] for i in n.inputs} & produced
    size = lambda names: sum(graph.specs[v].numel * graph.specs[v].dtype.itemsize for v in names)  # noqa: E731
    return size(read), size(produced)


def gradient_graph(graph: Graph, loss: str, wrt: Sequence[str]) -> Graph:
    """A copy of `graph` whose outputs are its own followed by the gradient of `loss` for each of `wrt`."""
    copy = graph.copy()
    grads = append_gradients(copy, loss, wrt)
    copy.outputs = list(copy.outputs) + [grads[w] for w in wrt]
    return copy
