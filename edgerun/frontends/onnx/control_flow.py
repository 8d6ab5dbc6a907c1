"""Subgraph ops that become static dataflow: If with a condition known at import time, and Scan unrolled over
its (static) sequence length. If on a run-time condition and Loop stay refused: that is real control flow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode
from edgerun.frontends.onnx.functions import rename_outer_refs

ImportNodes = Callable[[list[Any], str], None]  # (nodes, name prefix) -> imports them into ctx


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
        raise node.refuse("If on a condition computed at run time (data-dependent control flow)")
    branch = node.attr("then_branch") if bool(np.asarray(cond).reshape(-1)[0]) else node.attr("else_branch")
    outs = inline_graph(ctx, branch, f"{node.name or node.outputs[0]}/branch", {}, import_nodes)
    for dst, src in zip(node.outputs, outs):
        if dst:
            _alias(ctx, dst, src)


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
