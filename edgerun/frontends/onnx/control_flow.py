"""Subgraph ops that become static dataflow: If with a condition known at import time, and Scan unrolled over
its (static) sequence length. If on a run-time condition becomes a `where` select of both branches when both
are small and cannot fail for any input (SELECT_SAFE_OPS); otherwise it and Loop stay refused: that is real
control flow (issue #12).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.onnx.context import ImportContext, OnnxNode
from edgerun.frontends.onnx.functions import rename_outer_refs

ImportNodes = Callable[[list[Any], str], None]  # (nodes, name prefix) -> imports them into ctx

# Ops an If branch may hold to be imported as where(cond, then, else): both branches always run, so the one
# not taken must give *some* value for every input without failing or trapping. Elementwise float maths
# gives inf/NaN at worst, which `where` never lets through; shape ops here take static parameters (a
# run-time one fails the import, not the run). Left out on purpose: Div and Mod (integer division by zero),
# Gather and other index ops (out-of-range indices), Cast (NaN to integer), anything with a subgraph or a
# random generator.
SELECT_SAFE_OPS = {
    "Identity", "Constant", "Add", "Sub", "Mul", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Max", "Min",
    "Not", "And", "Or", "Xor", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Where",
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Flatten", "Expand", "Slice",
}
# Both branches always run, so only small ones are worth selecting between.
SELECT_MAX_NODES = 16


def inline_graph(ctx: ImportContext, body: Any, prefix: str, bind: dict[str, str],
                 import_nodes: ImportNodes) -> list[str]:
    """Import a subgraph's nodes with its inputs bound to outer ONNX names; returns its output names.

    Values the subgraph defines get `prefix`; names it only reads come from the enclosing scope.
    """
    import onnx
    from onnx import numpy_helper

    defined = {vi.name for vi in body.input} | {t.name for t in body.initializer}
    defined |= {o for n in body.node for o in n.output if o}
    rename = {name: f"{prefix}/{name}" for name in defined}
    rename.update(bind)
    for t in body.initializer:
        ctx.consts[rename[t.name]] = numpy_helper.to_array(t)
    nodes = []
    for inner in body.node:
        n = onnx.NodeProto()
        n.CopyFrom(inner)
        del n.input[:]
        n.input.extend(rename.get(i, i) if i else "" for i in inner.input)
        del n.output[:]
        n.output.extend(rename.get(o, o) if o else "" for o in inner.output)
        for a in n.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                rename_outer_refs(a.g, rename)
        n.name = f"{prefix}/{inner.name or inner.op_type}"
        nodes.append(n)
    import_nodes(nodes, prefix)
    return [rename.get(o.name, o.name) for o in body.output]


def _alias(ctx: ImportContext, dst: str, src: str) -> None:
    if src in ctx.consts:
        ctx.consts[dst] = ctx.consts[src]
    else:
        ctx.values[dst] = ctx.value(src)


def import_if(ctx: ImportContext, node: OnnxNode, import_nodes: ImportNodes) -> None:
    cond = ctx.const(node.inputs[0])
    if cond is None:
        _import_if_as_select(ctx, node, import_nodes)
        return
    branch = node.attr("then_branch") if bool(np.asarray(cond).reshape(-1)[0]) else node.attr("else_branch")
    outs = inline_graph(ctx, branch, f"{node.name or node.outputs[0]}/branch", {}, import_nodes)
    for dst, src in zip(node.outputs, outs):
        if dst:
            _alias(ctx, dst, src)


def _import_if_as_select(ctx: ImportContext, node: OnnxNode, import_nodes: ImportNodes) -> None:
    """where(cond, then, else) when both branches are small, cannot fail, and agree on shapes and dtypes:
    exactly the taken branch's values, for every input."""
    branches = [node.attr("then_branch"), node.attr("else_branch")]
    why = _unselectable(branches)
    if why:
        raise _runtime_if_refusal(ctx, node, why)
    prefix = node.name or node.outputs[0]
    try:
        then_outs, else_outs = (inline_graph(ctx, g, f"{prefix}/{side}", {}, import_nodes)
                                for g, side in zip(branches, ("then", "else")))
    except EdgerunError as exc:
        raise _runtime_if_refusal(ctx, node, f"a branch does not import on its own ({exc})") from exc
    for a, b in zip(then_outs, else_outs):
        if ctx.shape(a) != ctx.shape(b) or ctx.dtype(a) != ctx.dtype(b):
            raise _runtime_if_refusal(ctx, node, f"the branches give {ctx.dtype(a).value}{list(ctx.shape(a))} "
                                                 f"and {ctx.dtype(b).value}{list(ctx.shape(b))}")
    if int(np.prod(ctx.shape(node.inputs[0]))) != 1:
        raise ValueError(f"If condition has shape {ctx.shape(node.inputs[0])}, not a single element")
    c = ctx.emit("reshape", [ctx.value(node.inputs[0])], shape=[])
    for dst, a, b in zip(node.outputs, then_outs, else_outs):
        if dst:
            ctx.values[dst] = ctx.emit("where", [c, ctx.value(a), ctx.value(b)])


def _unselectable(branches: list[Any]) -> str:
    """Why these branches cannot be selected between with `where`, or '' when they can."""
    for g in branches:
        if len(g.node) > SELECT_MAX_NODES:
            return f"a branch has {len(g.node)} nodes (more than {SELECT_MAX_NODES} to run both)"
        unsafe = sorted({n.op_type for n in g.node if n.op_type not in SELECT_SAFE_OPS or n.domain not in ("", "ai.onnx")})
        if unsafe:
            return f"a branch uses {', '.join(unsafe)}, which could fail on the branch not taken"
    return ""


def _runtime_if_refusal(ctx: ImportContext, node: OnnxNode, why: str) -> UnsupportedOpError:
    """The refusal, naming the graph inputs the condition comes from so constant_inputs= is easy to find."""
    detail = f"If on a condition computed at run time (data-dependent control flow): {why}"
    inputs = ctx.inputs_behind(node.inputs[0])
    if inputs:
        spec = ", ".join(f"{n!r}: <{ctx.dtype(n).value}{list(ctx.shape(n))} value>" for n in inputs)
        detail += (f". The condition depends only on graph input{'s' if len(inputs) > 1 else ''} "
                   f"{', '.join(map(repr, inputs))}: freeze {'them' if len(inputs) > 1 else 'it'} with "
                   f"from_onnx(..., constant_inputs={{{spec}}}) to import the branch taken for that value")
    return node.refuse(detail)


def import_scan(ctx: ImportContext, node: OnnxNode, import_nodes: ImportNodes) -> None:
    if node.version < 9:
        raise node.refuse("opset-8 Scan (batched, with sequence_lens)")
    body = node.attr("body")
    m = int(node.attr("num_scan_inputs"))
    states, scans = node.inputs[:len(node.inputs) - m], node.inputs[len(node.inputs) - m:]
    in_axes = list(node.attr("scan_input_axes") or [0] * m)
    in_dirs = list(node.attr("scan_input_directions") or [0] * m)
    k = len(body.output) - len(states)
    out_axes = list(node.attr("scan_output_axes") or [0] * k)
    out_dirs = list(node.attr("scan_output_directions") or [0] * k)
    ranks = [len(ctx.shape(s)) for s in scans]
    in_axes = [a % r for a, r in zip(in_axes, ranks)]
    lengths = {ctx.shape(s)[a] for s, a in zip(scans, in_axes)}
    if len(lengths) != 1:
        raise ValueError(f"Scan inputs disagree on the sequence length: {sorted(lengths)}")
    steps = lengths.pop()
    if steps == 0:
        raise node.refuse("Scan over an empty sequence")
    prefix = node.name or node.outputs[0]
    b = ctx.b
    current = list(states)
    collected: list[list[str]] = [[] for _ in range(k)]
    for t in range(steps):
        bind = dict(zip([vi.name for vi in body.input[:len(states)]], current))
        for j, (s, axis, rev) in enumerate(zip(scans, in_axes, in_dirs)):
            pos = steps - 1 - t if rev else t
            shape = list(ctx.shape(s))
            piece = b.emit("slice", [ctx.value(s)], starts=[pos], ends=[pos + 1], axes=[axis])
            name = f"{prefix}/scan_in{j}_{t}"
            ctx.values[name] = b.emit("reshape", [piece], shape=shape[:axis] + shape[axis + 1:])
            bind[body.input[len(states) + j].name] = name
        outs = inline_graph(ctx, body, f"{prefix}/iter{t}", bind, import_nodes)
        current = outs[:len(states)]
        for j, o in enumerate(outs[len(states):]):
            collected[j].append(o)
    for dst, src in zip(node.outputs[:len(states)], current):
        if dst:
            _alias(ctx, dst, src)
    for j, dst in enumerate(node.outputs[len(states):]):
        if not dst:
            continue
        parts = collected[j][::-1] if out_dirs[j] else collected[j]
        shape = list(ctx.shape(parts[0]))
        axis = out_axes[j] % (len(shape) + 1)
        pieces = [b.emit("reshape", [ctx.value(p)], shape=[*shape[:axis], 1, *shape[axis:]]) for p in parts]
        ctx.values[dst] = b.emit("concat", pieces, axis=axis)
