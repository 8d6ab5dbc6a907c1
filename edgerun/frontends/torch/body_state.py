"""Buffers written in place inside a torch.cond branch or a torch.while_loop body, made functional before
torch's decomposition.

torch.export captures `self.total.add_(1)` inside a cond branch (under no_grad), but its decomposition cannot
functionalise a higher-order op's body ("aten.copy_ is not functional"), and the IR's bodies are closed,
functional graphs anyway. So before decomposing, each such write becomes what a user would write by hand:
the branch computes the buffer's new value out of place (`add_` -> `add`, later reads in the branch see the
new value) and returns it as an extra result (the other branch returns the buffer unchanged), and the top
level copies it into the buffer after the cond. In a while_loop body the buffer becomes a carried value
instead, its final value copied back after the loop. Torch then functionalises that top-level copy into an
ordinary buffer mutation, which the frontend turns into program state.

Anything else written in a body stays refused with the fix (capture.py): a write to a tensor that is not a
buffer, to a view of one, or in a while_loop's condition.
"""

from __future__ import annotations

import itertools
from typing import Any

COND_OPERANDS = 3  # torch.ops.higher_order.cond(pred, true_graph, false_graph, operands)


def in_place_writes(body: Any) -> list[tuple[Any, Any]]:
    """(node, written argument) for every in-place op in `body`'s graph, in order."""
    out = []
    for node in body.graph.nodes:
        schema = getattr(node.target, "_schema", None)
        if node.op != "call_function" or schema is None or not schema.is_mutable:
            continue
        for formal, actual in zip(schema.arguments, node.args):
            if formal.alias_info is not None and formal.alias_info.is_write:
                out.append((node, actual))
    return out


def functional_variant(target: Any) -> Any | None:
    """The out-of-place overload of an in-place aten op (`add_.Tensor` -> `add.Tensor`), or None."""
    import torch

    packet_name = target._schema.name.split("::")[-1]
    if not packet_name.endswith("_") or packet_name.endswith("__"):
        return None
    packet = getattr(torch.ops.aten, packet_name[:-1], None)
    overload = target._overloadname
    return getattr(packet, overload, None) if packet is not None else None


def functionalize_cond_buffer_writes(ep: Any) -> bool:
    """Rewrite, in place, every top-level cond whose branches write buffers (passed in as operands) in place
    by ops that have an out-of-place form; True when something changed. Writes it cannot rewrite are left
    for `capture.refuse_state_written_in_bodies` to refuse."""
    import torch

    buffers = set(ep.graph_signature.inputs_to_buffers)
    graph = ep.graph_module.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is torch.ops.higher_order.cond:
            changed |= _functionalize_cond(ep, node, buffers)
        elif node.target is torch.ops.higher_order.while_loop:
            changed |= _functionalize_while_loop(ep, node, buffers)
    if changed:
        ep.graph_module.recompile()
    return changed


def _functionalize_cond(ep: Any, node: Any, buffers: set[str]) -> bool:
    operands = list(node.args[COND_OPERANDS])
    branches = [getattr(ep.graph_module, str(a.target)) for a in node.args[1:COND_OPERANDS]]
    written = _written_buffers(branches, operands, buffers)
    if not written:
        return False
    for body in branches:
        _return_new_values(body, written)
    _copy_back(ep.graph_module.graph, node, operands, written)
    return True


def _functionalize_while_loop(ep: Any, node: Any, buffers: set[str]) -> bool:
    """while_loop(cond, body, carried, additional) whose body writes additional buffers in place: those
    buffers become carried values (moved after the carried ones in both bodies' inputs), the body returns
    their new values, and the loop's final values are copied back."""
    cond_fn, body_fn = (getattr(ep.graph_module, str(a.target)) for a in node.args[:2])
    carried, additional = list(node.args[2]), list(node.args[3])
    operands = carried + additional
    written = _written_buffers([body_fn], operands, buffers)
    if not written or in_place_writes(cond_fn) or any(i < len(carried) for i in written):
        return False
    rest = [i for i in range(len(carried), len(operands)) if i not in written]
    order = list(range(len(carried))) + written + rest
    for fn in (cond_fn, body_fn):
        _reorder_placeholders(fn, order)
    _return_new_values(body_fn, list(range(len(carried), len(carried) + len(written))))
    cond_fn.recompile()
    node.args = (*node.args[:2], tuple(carried + [operands[i] for i in written]),
                 tuple(operands[i] for i in rest))
    node.kwargs = {}  # torch's record of the mutated inputs: none are left
    _copy_back(ep.graph_module.graph, node, operands, written)
    return True


def _reorder_placeholders(fn: Any, order: list[int]) -> None:
    """Make `fn`'s inputs the old ones in `order` (placeholders bind positionally, in node order)."""
    placeholders = [n for n in fn.graph.nodes if n.op == "placeholder"]
    wanted = [placeholders[i] for i in order] + placeholders[len(order):]
    next(iter(fn.graph.nodes)).prepend(wanted[0])
    for before, after in itertools.pairwise(wanted):
        before.append(after)


def _written_buffers(branches: list[Any], operands: list[Any], buffers: set[str]) -> list[int] | None:
    """Operand positions the bodies write; None when some write cannot be rewritten (not a buffer operand,
    a view, or an op without an out-of-place form)."""
    positions: list[int] = []
    for body in branches:
        # an in-place op returns its argument, so `t.mul_(2).add_(1)` writes t twice
        alias = {n: k for k, n in enumerate(n for n in body.graph.nodes if n.op == "placeholder")}
        for node, arg in in_place_writes(body):
            if arg not in alias or functional_variant(node.target) is None:
                return None
            index = alias[node] = alias[arg]
            if index >= len(operands) or getattr(operands[index], "name", None) not in buffers:
                return None
            if index not in positions:
                positions.append(index)
    return positions


def _return_new_values(body: Any, written: list[int]) -> None:
    """In `body`: each in-place write out of place, later reads of the buffer reading the new value, and the
    new values of `written` (operand positions) appended to its results (a clone where this branch leaves
    the buffer as it is, so no result aliases an operand)."""
    import torch

    g = body.graph
    placeholders = [n for n in g.nodes if n.op == "placeholder"]
    current = {i: placeholders[i] for i in written}
    while writes := in_place_writes(body):
        node, arg = writes[0]  # its argument is the buffer's current value (earlier writes were rewritten)
        index = next(k for k, value in current.items() if value is arg)
        with g.inserting_after(node):
            new = g.call_function(functional_variant(node.target), node.args, node.kwargs)
        new.meta = dict(node.meta)
        old = current[index]
        node.replace_all_uses_with(new)
        # reads of the buffer after the write see the new value
        order = {n: k for k, n in enumerate(g.nodes)}
        for user in list(old.users):
            if user is not new and order[user] > order[new]:
                user.replace_input_with(old, new)
        g.erase_node(node)
        current[index] = new
    output = next(n for n in g.nodes if n.op == "output")
    results = list(output.args[0]) if isinstance(output.args[0], (list, tuple)) else [output.args[0]]
    extra = []
    for index in written:
        value = current[index]
        if value is placeholders[index]:
            with g.inserting_before(output):
                value = g.call_function(torch.ops.aten.clone.default, (value,))
            value.meta = dict(placeholders[index].meta)
        extra.append(value)
    output.args = (tuple(results + extra),)
    g.lint()
    body.recompile()


def _copy_back(graph: Any, cond: Any, operands: list[Any], written: list[int]) -> None:
    """After `cond`: take its new results and copy each into its buffer, in place (torch functionalises it)."""
    import operator

    import torch

    count = len(cond.meta["val"]) if isinstance(cond.meta.get("val"), (list, tuple)) else None
    if count is None:
        count = max((u.args[1] for u in cond.users if u.target is operator.getitem), default=-1) + 1
    anchor = max(cond.users, key=lambda u: list(graph.nodes).index(u), default=cond)
    vals = []
    for k, index in enumerate(written):
        buffer = operands[index]
        with graph.inserting_after(anchor):
            item = graph.call_function(operator.getitem, (cond, count + k))
        item.meta = dict(buffer.meta)
        with graph.inserting_after(item):
            copy = graph.call_function(torch.ops.aten.copy_.default, (buffer, item))
        copy.meta = dict(buffer.meta)
        anchor = copy
        vals.append(buffer.meta.get("val"))
    if isinstance(cond.meta.get("val"), (list, tuple)):
        cond.meta["val"] = type(cond.meta["val"])([*cond.meta["val"], *vals])
    graph.lint()
