"""Reverse-mode differentiation of an IR graph: the backward graph appended as ordinary IR.

`append_gradients(graph, loss, wrt)` lowers the composites that have no gradient rule of their own
(registry.gradient_rule: softmax, log-softmax, layer norm and relu keep theirs), then walks the nodes from
the loss back to the values in `wrt`, calling each op's vector-Jacobian product (written beside the op, in
ir/ops/*) and summing the cotangents of values read more than once (a table gathered twice: the second
gather's updates scattered into the first's gradient, not added densely). Only nodes on a path from a value in
`wrt` to the loss are differentiated; a value of integer or bool type carries no gradient (an argmax, a
comparison, a cast to int ends a path, as in torch). A path through an op with no gradient (a quantized op,
control flow, a data-dependent op) is a NoGradientError naming the node.

What backward keeps: the rules read forward values (a node's inputs or outputs) directly, so the backward
graph holds on to the activations some rule reads, and the memory plan frees every other one after its last
forward use. `recompute_cheap` then chooses what to keep and what to compute again: an activation backward
reads that a cheap elementwise op made (unary, binary, comparison, where, cast, relu, clamp) from values
backward keeps anyway, from inputs, weights or state, or from other such recomputable values, is computed
again just before backward's first read of it instead of being held from the forward to there (a relu's
output from its input, which the relu rule keeps; the intermediates of a GELU from its input). Elementwise
inputs are never larger than the output, so this never keeps more bytes across the forward/backward
boundary; the copies are marked (meta "recomputed") so common-subexpression elimination leaves them apart.
`recompute_to_budget` goes further for a memory budget: it recomputes more activations (matmul and conv
outputs too), the most bytes freed per unit of work first, until the kept ones fit.
Because the result is one ordinary graph, every backend runs it and every pass (decomposition, folding,
raster merging, dead code) and the memory planner treat it like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.decompose import decompose, restore_output_names
from edgerun.ir.graph import Graph, Node
from edgerun.ir.registry import NoGradientError, OpKind, get_op, gradient_rule, no_gradient_reason


def _is_float(graph: Graph, value: str) -> bool:
    return bool(value) and graph.specs[value].dtype.is_float


def _where(node: Node) -> str:
    source = node.meta.get("source") or node.meta.get("module_path")
    return f" at {source}" if source else ""


def _is_zeros(graph: Graph, value: str) -> bool:
    """A constant of zeros, or one expanded (the zeros a gather's gradient scatters into)."""
    if value in graph.constants:
        return not np.any(graph.constants[value])
    node = next((n for n in reversed(graph.nodes) if value in n.outputs), None)
    return node is not None and node.op == "expand" and _is_zeros(graph, node.inputs[0])


def _accumulate(b: Builder, graph: Graph, total: str, g: str) -> str:
    """total + g. A g that is updates scattered into zeros (a gather's gradient: an embedding table read
    twice) is scattered into total instead: no dense add over the table, no table of zeros."""
    node = next((n for n in reversed(graph.nodes) if g in n.outputs), None)
    if node is not None and node.op == "scatter_add" and _is_zeros(graph, node.inputs[0]):
        return b.emit("scatter_add", [total, *node.inputs[1:]], **node.attrs)
    return b.binary("add", total, g)


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
            cotangents[value] = _accumulate(b, graph, cotangents[value], g) if value in cotangents else g
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


RECOMPUTED = "recomputed"  # node meta: a forward node computed again for backward (value: the original's name)
_CHEAP_FAMILIES = frozenset({"unary", "binary", "compare"})
_CHEAP_OPS = frozenset({"where", "cast", "relu", "clamp", "logical_not"})


def _cheap(node: Node) -> bool:
    """One pass over its elements, no reduction or data movement: cheaper to compute again than to keep."""
    return node.op in _CHEAP_OPS or get_op(node.op).family in _CHEAP_FAMILIES


def recompute_cheap(graph: Graph, forward_nodes: int) -> list[str]:
    """Recompute, for the backward part of `graph` (the nodes after the first `forward_nodes`), the forward
    activations it reads that cheap elementwise ops make from values it keeps anyway (see the module
    docstring); returns the activations no longer kept. In place; the graph computes the same values."""
    forward, backward = graph.nodes[:forward_nodes], graph.nodes[forward_nodes:]
    producer = {o: n for n in forward for o in n.outputs}
    free = set(graph.inputs) | set(graph.constants) | set(graph.state_inputs)
    read = {i for n in backward for i in n.inputs if i in producer}
    recomputable: set[str] = set()
    for node in forward:  # in order: an input's fate is decided before its readers'
        if len(node.outputs) == 1 and _cheap(node) and node.outputs[0] not in graph.outputs and all(
                not i or i in free or i in recomputable or i in read for i in node.inputs):
            recomputable.add(node.outputs[0])
    dropped = sorted(v for v in read if v in recomputable)
    if dropped:
        _compute_again(graph, forward_nodes, recomputable)
    return dropped


def _compute_again(graph: Graph, forward_nodes: int, values: set[str]) -> None:
    """Give backward its own copy of each forward value in `values` (and of the values in `values` it is
    made from), each copy right before backward's first read of it."""
    forward, backward = graph.nodes[:forward_nodes], graph.nodes[forward_nodes:]
    producer = {o: n for n in forward for o in n.outputs}
    copies: dict[str, str] = {}
    emitted: list[Node] = []

    def copy_of(value: str) -> str:
        if value not in values:
            return value
        if value not in copies:
            node = producer[value]
            inputs = [copy_of(i) if i else i for i in node.inputs]
            out = graph.fresh_name(f"{value}_again")
            graph.specs[out] = graph.specs[value]
            emitted.append(Node(node.op, inputs, [out], dict(node.attrs), {**node.meta, RECOMPUTED: node.name},
                                graph.fresh_name(f"{node.name}_again")))
            copies[value] = out
        return copies[value]

    rebuilt: list[Node] = []
    for node in backward:
        node.inputs = [copy_of(i) if i else i for i in node.inputs]
        rebuilt.extend(emitted)  # each copy right before backward's first read of it
        emitted.clear()
        rebuilt.append(node)
    graph.nodes = forward + rebuilt


def _work(graph: Graph, node: Node) -> int:
    """Multiply-adds (matmul, conv2d) or elements touched (anything else): what computing `node` again costs."""
    out = graph.specs[node.outputs[0]]
    if node.op == "matmul":
        return out.numel * graph.specs[node.inputs[0]].shape[-1]
    if node.op == "conv2d":
        _, ci, kh, kw = graph.specs[node.inputs[1]].shape
        return out.numel * ci * kh * kw
    return out.numel + sum(graph.specs[i].numel for i in node.inputs if i)


def _pure(node: Node) -> bool:
    """Computed from its inputs alone, the same way every time: safe to compute a second time."""
    kind = get_op(node.op).kind
    return kind not in (OpKind.CONTROL_FLOW, OpKind.DATA_DEPENDENT) and len(node.outputs) == 1


def recompute_to_budget(graph: Graph, forward_nodes: int, budget: int) -> tuple[list[str], int]:
    """Checkpointing to a memory budget: after recompute_cheap, while the forward activations backward
    keeps take more than `budget` bytes, recompute the one that frees the most bytes per unit of work
    (matmul and conv multiply-adds, elements elsewhere), its inputs kept instead where they are not kept
    already (a matmul's output from its kept input: the input's bytes added, the output's freed). Stops when
    the kept bytes fit or no recompute frees any. Returns (the activations no longer kept, the bytes kept)."""
    dropped = recompute_cheap(graph, forward_nodes)
    forward, backward = graph.nodes[:forward_nodes], graph.nodes[forward_nodes:]
    producer = {o: n for n in forward for o in n.outputs}
    free = set(graph.inputs) | set(graph.constants) | set(graph.state_inputs) | set(graph.outputs)
    kept = {i for n in backward for i in n.inputs if i in producer and i not in free}
    size = lambda v: graph.specs[v].numel * graph.specs[v].dtype.itemsize  # noqa: E731
    total = sum(size(v) for v in kept)
    again: set[str] = set()
    while total > budget:
        best: tuple[float, str, set[str]] | None = None
        for value in sorted(kept):
            node = producer[value]
            if not _pure(node):
                continue
            needed = {i for i in node.inputs if i and i not in free and i not in kept and i not in again}
            saved = size(value) - sum(size(i) for i in needed)
            if saved <= 0:
                continue
            score = _work(graph, node) / saved
            if best is None or score < best[0]:
                best = (score, value, needed)
        if best is None:
            break
        _, value, needed = best
        kept.remove(value)
        kept |= needed
        again.add(value)
        total = sum(size(v) for v in kept)
    if again:
        _compute_again(graph, forward_nodes, again)
    return sorted({*dropped, *again}), total


def gradient_graph(graph: Graph, loss: str, wrt: Sequence[str]) -> Graph:
    """A copy of `graph` whose outputs are its own followed by the gradient of `loss` for each of `wrt`."""
    copy = graph.copy()
    grads = append_gradients(copy, loss, wrt)
    copy.outputs = list(copy.outputs) + [grads[w] for w in wrt]
    return copy
