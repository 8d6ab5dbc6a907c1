"""ONNX If, Loop and Scan as the IR's control-flow ops (cond, while_loop, scan), bodies as closed subgraphs.

An If whose condition is known at import time (folded from static shapes, or an input frozen with
constant_inputs=) inlines the branch taken; any other If becomes `cond`. A Loop becomes `while_loop`
(its trip counter and condition carried beside its loop-carried values), or `scan` when it runs a trip
count known at import time and stacks per-iteration outputs; a Loop that stacks outputs over a trip count
known only at run time is refused (the result's length would depend on data). A Scan becomes `scan`, its
axes and directions turned into transposes and reversals around it.

ONNX bodies read enclosing values by name; ours are closed. So each body is imported into a graph of its
own (ImportContext over a new Graph): the values it reads from outside that are known at import time are
copied in as constants (so they keep folding), and the run-time ones become extra body inputs, passed by
the node. Body output shapes must not depend on the trip (IR shapes are static).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from edgerun.frontends.onnx.context import (
    DynamicInputError,
    ImportContext,
    OnnxImportError,
    OnnxNode,
    ShapeBoundsError,
)
from edgerun.frontends.onnx.functions import rename_outer_refs
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.specialize import guards
from edgerun.ir.subgraphs import add_subgraph
from edgerun.ir.tensor_spec import TensorSpec

ImportInto = Callable[[ImportContext, list[Any]], None]  # imports ONNX nodes into the given context

_BOOL = TensorSpec((), DType.bool)
_INT64 = TensorSpec((), DType.int64)


# -- bodies ---------------------------------------------------------------------------------------------------

def outer_reads(body: Any) -> list[str]:
    """The names an ONNX graph (and the graphs inside it) reads from enclosing scopes, in first-use order."""
    local = {vi.name for vi in body.input} | {t.name for t in body.initializer}
    local |= {o for n in body.node for o in n.output}
    found: dict[str, None] = {}
    for n in body.node:
        for name in n.input:
            if name and name not in local:
                found[name] = None
        for a in n.attribute:
            if a.type == 5:  # GRAPH
                found.update((name, None) for name in outer_reads(a.g) if name not in local)
    found.update((o.name, None) for o in body.output if o.name not in local)
    return list(found)


def captured_values(ctx: ImportContext, bodies: Sequence[Any]) -> list[str]:
    """The run-time values (not import-time constants) the bodies read from `ctx`'s scope."""
    names: dict[str, None] = {}
    for body in bodies:
        names.update((n, None) for n in outer_reads(body) if n not in ctx.consts)
    for n in names:
        ctx.value(n)  # a clear error for a name nothing defines
    return list(names)


def import_body(ctx: ImportContext, body: Any, formals: Sequence[tuple[str, TensorSpec]], captured: Sequence[str],
                import_into: ImportInto) -> tuple[ImportContext, list[str]]:
    """Import ONNX graph `body` as a closed graph: inputs `formals` (ONNX name, spec) then `captured` (outer
    run-time values, same names); returns its context and the IR values of its outputs."""
    from onnx import numpy_helper

    # The body sees the outer symbols' bounds, so its shape rules decide what the outer graph's would
    # (silero-vad's 16 kHz branch squeezes a frame count that the bounds make 1).
    child = ImportContext(Graph(symbols=dict(ctx.graph.symbols)))
    child.in_body = True
    child.guarded = ctx.guarded
    for name, spec in formals:
        child.values[name] = child.graph.add_input(name, spec)
    for name in captured:
        child.values[name] = child.graph.add_input(name, TensorSpec(ctx.shape(name), ctx.dtype(name)))
    for name in outer_reads(body):
        if name in ctx.consts and name not in child.values:
            child.consts[name] = ctx.consts[name]
    for t in body.initializer:
        child.bind_constant(t.name, numpy_helper.to_array(t))
    import_into(child, list(body.node))
    return child, [child.value(o.name) for o in body.output]


def _close(child: ImportContext, outputs: list[str]) -> Graph:
    child.graph.outputs = outputs
    child.graph.prune_specs()
    return child.graph


# -- If -------------------------------------------------------------------------------------------------------

def inline_graph(ctx: ImportContext, body: Any, prefix: str, import_into: ImportInto,
                 inputs: Sequence[str] = ()) -> list[str]:
    """Import a branch's nodes into `ctx` itself (values it defines get `prefix`); returns its output names.

    `inputs` are outer names bound to the body's formal inputs (a Loop trip or SequenceMap element unrolled)."""
    import onnx
    from onnx import numpy_helper

    defined = {t.name for t in body.initializer} | {o for n in body.node for o in n.output if o}
    defined |= {vi.name for vi in body.input[:len(inputs)]}
    rename = {name: f"{prefix}/{name}" for name in defined}
    for vi, outer in zip(body.input, inputs):
        alias(ctx, rename[vi.name], outer)
    for t in body.initializer:
        ctx.bind_constant(rename[t.name], numpy_helper.to_array(t))
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
    import_into(ctx, nodes)
    return [rename.get(o.name, o.name) for o in body.output]


def alias(ctx: ImportContext, dst: str, src: str) -> None:
    """Bind ONNX name `dst` to whatever `src` is: a constant, an IR value, a sequence or an empty optional."""
    if src in ctx.sequences:
        ctx.sequences[dst] = list(ctx.sequences[src])
    elif src in ctx.absent:
        ctx.absent.add(dst)
    elif src in ctx.consts:
        ctx.consts[dst] = ctx.consts[src]
    else:
        ctx.values[dst] = ctx.value(src)


def import_if(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    pred = ctx.const(node.inputs[0])
    if pred is not None:
        taken = node.attr("then_branch") if bool(np.asarray(pred).reshape(-1)[0]) else node.attr("else_branch")
        outs = inline_graph(ctx, taken, f"{node.name or node.outputs[0]}/branch", import_into)
        for dst, src in zip(node.outputs, outs):
            if dst:
                alias(ctx, dst, src)
        return
    branches = [node.attr("then_branch"), node.attr("else_branch")]
    if int(np.prod(ctx.shape(node.inputs[0]))) != 1:
        raise ValueError(f"If condition has shape {ctx.shape(node.inputs[0])}, not a single element")
    captured = captured_values(ctx, branches)
    names, failures = [], []
    for side, branch in zip(("then", "else"), branches):
        try:
            child, outs = import_body(ctx, branch, [], captured, import_into)
        except (ValueError, OnnxImportError, ShapeBoundsError) as exc:
            # ONNX models branch on shapes (silero-vad's 8 kHz branch cannot run on a 16 kHz chunk): a branch
            # whose shapes do not work out at the import's shapes, or not at every shape within the symbols'
            # bounds, is left out, and taking it is a run-time error.
            names.append("")
            failures.append(f"{side} branch: {exc}")
            continue
        names.append(add_subgraph(ctx.graph, _close(child, outs), side))
    if len(failures) == 2:
        raise node.refuse(f"neither branch imports at these shapes ({'; '.join(failures)})")
    if not failures and ctx.guarded:
        _keep_guarded_branch(ctx, names, failures)
    extra = {"unreachable": failures[0][:500]} if failures else {}
    try:
        results = ctx.b.emit_multi("cond", [ctx.value(node.inputs[0]), *(ctx.value(n) for n in captured)],
                                   then=names[0], **{"else": names[1]}, **extra)
    except ValueError as exc:
        raise node.refuse(str(exc)) from None
    for dst, value in zip(node.outputs, results):
        if dst:
            ctx.values[dst] = value


def _keep_guarded_branch(ctx: ImportContext, names: list[str], failures: list[str]) -> None:
    """Branches that give different shapes (a squeeze taken where a frame count is 1, rank 2 against the
    other's rank 3) cannot be one cond. Where one branch holds only under a guard, that branch is the
    structure the sizes choose when its guard holds: it is kept, and the other left out (taking it, or a size
    failing the guard, is refused at that size; ir/specialize.py)."""
    bodies = [ctx.graph.subgraphs[n] for n in names]
    specs = [[b.specs[o] for o in b.outputs] for b in bodies]
    guarded = [bool(guards(b)) for b in bodies]
    if specs[0] == specs[1] or guarded.count(True) != 1:
        return
    keep = guarded.index(True)
    drop = 1 - keep
    del ctx.graph.subgraphs[names[drop]]
    failures.append(f"{('then', 'else')[drop]} branch: gives {specs[drop]}, the {('then', 'else')[keep]} branch "
                    f"{specs[keep]} (one program holds one shape per value; the other branch is kept, under its "
                    "guard)")
    names[drop] = ""


# -- Loop -----------------------------------------------------------------------------------------------------

def import_loop(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    body = node.attr("body")
    trip = ctx.const(node.inputs[0]) if node.has_input(0) else None
    carried = node.inputs[2:]
    k = len(carried)
    n_scan_out = len(body.output) - 1 - k
    captured = captured_values(ctx, [body])
    formals = [(body.input[0].name, _INT64), (body.input[1].name, _BOOL),
               *((vi.name, TensorSpec(ctx.shape(v), ctx.dtype(v))) for vi, v in zip(body.input[2:], carried))]
    child, outs = import_body(ctx, body, formals, captured, import_into)
    cb = child.b
    step = cb.emit("add", [child.graph.inputs[0], cb.const(np.array(1, np.int64))])
    keep_going = cb.emit("reshape", [outs[0]], shape=[]) if node.has_input(1) else cb.const(np.array(True))
    for j, (value, spec) in enumerate(zip(outs[1:1 + k], formals[2:])):
        if child.graph.specs[value] != spec[1]:
            raise node.refuse(f"loop-carried value {j} changes from {spec[1]} to {child.graph.specs[value]} in a "
                              "trip (carried shapes must stay fixed)")
    prefix = node.name or node.outputs[0]
    invariants = [ctx.value(n) for n in captured]
    if n_scan_out:
        # Stacked per-trip outputs: only a count fixed at import time gives them a static length.
        if trip is None or (node.has_input(1) and not _always_true(ctx, node, body)):
            raise _run_time_trips(ctx, node)
        length = int(np.asarray(trip).reshape(-1)[0])
        if length < 1:
            raise node.refuse("a Loop with scan outputs and no trips (empty outputs)")
        # scan body: (iter, cond, carried..., captured...) -> (iter + 1, carried'..., per-trip outputs...)
        graph = _close(child, [step, *outs[1:]])
        cond_in = graph.inputs.pop(1)  # the condition stays True (see _always_true): a constant, not a carry
        graph.constants[cond_in] = np.array(True)
        name = add_subgraph(ctx.graph, graph, "loop")
        results = ctx.b.emit_multi("scan", [ctx.b.const(np.array(0, np.int64)), *(ctx.value(v) for v in carried),
                                            *invariants], body=name, num_carried=1 + k, num_sequences=0,
                                   length=length)
        for dst, value in zip(node.outputs, results[1:]):
            if dst:
                ctx.values[dst] = value
        return
    body_graph = _close(child, [step, keep_going, *outs[1:1 + k]])
    # Both bodies take (iter, cond, carried..., max trips, captured...); the test is cond and iter < max trips.
    max_in = body_graph.add_input(f"{prefix}/max_trips", _INT64)
    body_graph.inputs.remove(max_in)
    body_graph.inputs.insert(2 + k, max_in)
    test = Graph()
    for j, v in enumerate(body_graph.inputs):
        test.add_input(f"in{j}", body_graph.specs[v])
    tb = Builder(test)
    it, go, limit = test.inputs[0], test.inputs[1], test.inputs[2 + k]
    test.outputs = [tb.emit("logical_and", [go, tb.emit("lt", [it, limit])])]
    first = ctx.b.emit("reshape", [ctx.value(node.inputs[1])], shape=[]) if node.has_input(1) else \
        ctx.b.const(np.array(True))
    max_trips = ctx.b.emit("reshape", [ctx.b.emit("cast", [ctx.value(node.inputs[0])], dtype="int64")], shape=[]) \
        if node.has_input(0) else ctx.b.const(np.array(np.iinfo(np.int64).max, np.int64))
    names = [add_subgraph(ctx.graph, test, "loop_cond"), add_subgraph(ctx.graph, body_graph, "loop_body")]
    results = ctx.b.emit_multi("while_loop", [ctx.b.const(np.array(0, np.int64)), first,
                                              *(ctx.value(v) for v in carried), max_trips, *invariants],
                               cond=names[0], body=names[1], num_carried=2 + k)
    for dst, value in zip(node.outputs, results[2:]):
        if dst:
            ctx.values[dst] = value


def _run_time_trips(ctx: ImportContext, node: OnnxNode) -> DynamicInputError:
    """The refusal of stacked outputs over a run-time trip count, naming a graph input behind the count (the
    ONNX test backend freezes it and imports again)."""
    behind = [n for i in node.inputs[:2] if i for n in ctx.inputs_behind(i)]
    return DynamicInputError(node.op_type, behind[0] if behind else node.inputs[0], source=node.name or None,
                             detail="a Loop with scan outputs whose trip count or condition is known only at run "
                                    "time: the stacked outputs' length would depend on data (freeze the inputs "
                                    f"behind it{', ' + ', '.join(map(repr, behind)) if behind else ''}, with "
                                    "constant_inputs=)")


def _always_true(ctx: ImportContext, node: OnnxNode, body: Any) -> bool:
    """A Loop condition that starts True and that the body passes through unchanged (exporters' for-loops)."""
    first = ctx.const(node.inputs[1])
    if first is None or not bool(np.asarray(first).reshape(-1)[0]):
        return False
    out, cond_in = body.output[0].name, body.input[1].name
    if out == cond_in:
        return True
    producer = next((n for n in body.node if out in n.output), None)
    return producer is not None and producer.op_type == "Identity" and producer.input[0] == cond_in


# -- Scan -----------------------------------------------------------------------------------------------------

def import_scan(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    body = node.attr("body")
    m = int(node.attr("num_scan_inputs"))
    b = ctx.b
    if node.version < 9:
        _import_batched_scan(ctx, node, import_into, m)
        return
    states, scans = node.inputs[:len(node.inputs) - m], node.inputs[len(node.inputs) - m:]
    k = len(body.output) - len(states)
    in_axes = [int(a) % len(ctx.shape(s)) for a, s in zip(node.attr("scan_input_axes") or [0] * m, scans)]
    sequences = []
    for s, axis, reverse in zip(scans, in_axes, node.attr("scan_input_directions") or [0] * m):
        v = ctx.value(s)
        rank = len(ctx.shape(s))
        if axis:
            v = b.emit("transpose", [v], perm=[axis, *(a for a in range(rank) if a != axis)])
        sequences.append(_reverse(b, v) if reverse else v)
    results = _scan(ctx, node, import_into, [ctx.value(s) for s in states], sequences)
    outs = results[:len(states)]
    for value, axis, reverse in zip(results[len(states):], node.attr("scan_output_axes") or [0] * k,
                                    node.attr("scan_output_directions") or [0] * k):
        if reverse:
            value = _reverse(b, value)
        rank = len(b.shape(value))
        if int(axis) % rank:
            perm = list(range(1, rank))
            perm.insert(int(axis) % rank, 0)
            value = b.emit("transpose", [value], perm=perm)
        outs.append(value)
    for dst, value in zip(node.outputs, outs):
        if dst:
            ctx.values[dst] = value


def _import_batched_scan(ctx: ImportContext, node: OnnxNode, import_into: ImportInto, m: int) -> None:
    """Opset-8 Scan: a leading batch axis on every state and sequence (sequences scan axis 1): one scan per
    batch element, their results joined again."""
    if node.has_input(0):
        raise node.refuse("opset-8 Scan with sequence_lens")
    states, scans = node.inputs[1:len(node.inputs) - m], node.inputs[len(node.inputs) - m:]
    b = ctx.b
    batch = {ctx.shape(v)[0] for v in (*states, *scans)}
    if len(batch) != 1:
        raise ValueError(f"opset-8 Scan inputs disagree on the batch size: {sorted(batch)}")
    per_item: list[list[str]] = []
    for i in range(batch.pop()):
        def item(v: str, i: int = i) -> str:
            shape = list(ctx.shape(v))
            return b.emit("reshape", [b.emit("slice", [ctx.value(v)], starts=[i], ends=[i + 1], axes=[0])],
                          shape=shape[1:])
        sequences = [item(s) for s in scans]
        sequences = [_reverse(b, v) if rev else v for v, rev in zip(sequences, node.attr("directions") or [0] * m)]
        per_item.append(_scan(ctx, node, import_into, [item(s) for s in states], sequences))
    for j, dst in enumerate(node.outputs):
        if dst:
            parts = [b.emit("reshape", [r[j]], shape=[1, *b.shape(r[j])]) for r in per_item]
            ctx.values[dst] = parts[0] if len(parts) == 1 else b.emit("concat", parts, axis=0)


def _scan(ctx: ImportContext, node: OnnxNode, import_into: ImportInto, states: list[str],
          sequences: list[str]) -> list[str]:
    """The IR scan of ONNX Scan's body over `sequences` (each scanned along axis 0) from `states`."""
    b = ctx.b
    lengths = {b.shape(v)[0] for v in sequences}
    if len(lengths) != 1:
        raise ValueError(f"Scan inputs disagree on the sequence length: {sorted(lengths)}")
    length = lengths.pop()
    if length == 0:
        raise node.refuse("Scan over an empty sequence")
    body = node.attr("body")
    captured = captured_values(ctx, [body])
    formals = [(vi.name, b.spec(v)) for vi, v in zip(body.input, states)]
    formals += [(vi.name, TensorSpec(b.shape(v)[1:], b.dtype(v))) for vi, v in zip(body.input[len(states):], sequences)]
    child, outs = import_body(ctx, body, formals, captured, import_into)
    name = add_subgraph(ctx.graph, _close(child, outs), "scan")
    return b.emit_multi("scan", [*states, *sequences, *(ctx.value(n) for n in captured)], body=name,
                        num_carried=len(states), num_sequences=len(sequences), length=length)


def _reverse(b: Builder, x: str) -> str:
    """`x` with its leading axis reversed (the end clamps, so a symbolic length needs no arithmetic)."""
    return b.emit("slice", [x], starts=[-1], ends=[-(2 ** 62)], axes=[0], steps=[-1])


CONTROL_FLOW_IMPORTERS: dict[str, Callable[[ImportContext, OnnxNode, ImportInto], None]] = {
    "If": import_if, "Loop": import_loop, "Scan": import_scan}
