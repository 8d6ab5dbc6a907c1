"""ONNX sequences and optionals, resolved at import time into tensors.

edgerun values are tensors, but a sequence whose length is known at import time is just a Python list of
tensors, and an optional is a tensor (or sequence) or nothing. The importer holds them so
(`ImportContext.sequences`: ONNX name -> the ONNX names of its elements; `ImportContext.absent`: empty
optionals; a present optional is its content under its own name), and every sequence op becomes list
manipulation plus ordinary tensor ops (Split, Concat) on the elements. A graph input of sequence type is
one program input per element (`<name>.<i>`); `input_shapes=` gives the structure: a list of element
shapes for a sequence, and for an optional input its content's shape (a tuple, or a list for a sequence)
or None when it is empty. Graph outputs become their elements, in order; `output_layout` records how to
group them back (program metadata "onnx_outputs"; the ONNX backend returns a sequence as a list).

Anything that would make a length depend on run-time data needs the value at import time: a SequenceAt /
Insert / Erase position, SplitToSequence's split, a Loop's trip count, an If's condition when its branches
give different structures. Each is read with `ctx.static`, so a graph input behind it makes the model a
value template (specialised per value at call time, value_template.py), and a value computed at run time is
refused naming the node. Loops carrying a sequence or optional are unrolled at import time, and so is a Loop
whose body needs a value at import time that it computes from its trip counter (a Slice start; importer.py
falls back to unrolling when the IR loop cannot hold it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx.context import ImportContext, OnnxModelError, OnnxNode, onnx_dtype
from edgerun.frontends.onnx.control_flow import ImportInto, alias, inline_graph
from edgerun.ir.tensor_spec import TensorSpec

SEQUENCE_OPS = {"SequenceEmpty", "SequenceConstruct", "SequenceAt", "SequenceInsert", "SequenceErase",
                "SequenceLength", "SplitToSequence", "ConcatFromSequence", "SequenceMap", "Optional",
                "OptionalHasElement", "OptionalGetElement"}
# Trips a Loop carrying a sequence may unroll to (each trip is imported as nodes of its own).
MAX_UNROLLED_TRIPS = 4096

StructuredImporter = Callable[[ImportContext, OnnxNode, ImportInto], None]


# -- graph inputs and outputs ---------------------------------------------------------------------------------

def is_structured_type(type_proto: Any) -> bool:
    return type_proto.WhichOneof("value") != "tensor_type"


def bind_structured_input(ctx: ImportContext, vi: Any, shapes: Mapping[str, Any]) -> None:
    """A sequence or optional graph input as program inputs, one per tensor it holds (structure from
    `shapes`, i.e. input_shapes=)."""
    if vi.name not in shapes:
        raise OnnxModelError(f"input {vi.name!r} is a {_kind_name(vi.type)}: give its structure in input_shapes= "
                             "(a list of element shapes for a sequence; for an optional, its content's shape, "
                             "or None when empty)")
    _bind(ctx, vi.name, vi.type, shapes[vi.name])


def _bind(ctx: ImportContext, name: str, type_proto: Any, given: Any) -> None:
    kind = type_proto.WhichOneof("value")
    if kind == "optional_type":
        if given is None:
            ctx.absent.add(name)
            return
        _bind(ctx, name, type_proto.optional_type.elem_type, given)
    elif kind == "sequence_type":
        if not isinstance(given, list):
            raise OnnxModelError(f"input_shapes[{name!r}] must be a list of element shapes (a sequence input)")
        elements = []
        for i, shape in enumerate(given):
            elements.append(f"{name}.{i}")
            _bind(ctx, elements[-1], type_proto.sequence_type.elem_type, tuple(shape))
        ctx.sequences[name] = elements
    elif kind == "tensor_type":
        if not isinstance(given, tuple) or not all(isinstance(d, int) for d in given):
            raise OnnxModelError(f"input_shapes[{name!r}] must be a tuple of ints, got {given!r}")
        dtype = onnx_dtype(type_proto.tensor_type.elem_type, f"input {name}")
        ctx.values[name] = ctx.graph.add_input(name, TensorSpec(given, dtype))
    else:
        raise ctx_refusal(name, f"{kind} values are not supported (maps hold keys of any type)")


def ctx_refusal(name: str, detail: str) -> UnsupportedOpError:
    return UnsupportedOpError(f"value {name}", detail=detail)


def _kind_name(type_proto: Any) -> str:
    return str(type_proto.WhichOneof("value")).replace("_type", "")


def flatten_output(ctx: ImportContext, name: str) -> tuple[list[str], list[Any]]:
    """The IR values a graph output holds, and its layout entry [name, kind, count]."""
    if name in ctx.absent:
        return [], [name, "none", 0]
    if name in ctx.sequences:
        return [ctx.value(e) for e in _tensors(ctx, name)], [name, "sequence", len(ctx.sequences[name])]
    return [ctx.value(name)], [name, "tensor", 1]


def _tensors(ctx: ImportContext, name: str) -> list[str]:
    elements = ctx.sequences[name]
    for e in elements:
        if e in ctx.sequences or e in ctx.absent:
            raise ctx_refusal(name, "a sequence of sequences or optionals as a graph output")
    return elements


OUTPUT_LAYOUT_KEY = "onnx_outputs"


def with_output_layout(program: Any, layout: list[Any]) -> Any:
    """`program` with the layout of its ONNX outputs in its metadata, when one is a sequence or optional."""
    if any(kind != "tensor" for _name, kind, _count in layout):
        program.metadata[OUTPUT_LAYOUT_KEY] = layout
    return program


def group_outputs(flat: Sequence[Any], layout: Sequence[Sequence[Any]]) -> list[Any]:
    """Program outputs grouped back as ONNX gives them: a sequence as a list, an empty optional as None."""
    out: list[Any] = []
    i = 0
    for _name, kind, count in layout:
        if kind == "none":
            out.append(None)
        elif kind == "sequence":
            out.append(list(flat[i:i + count]))
        else:
            out.append(flat[i])
        i += int(count)
    return out


def structure_of(value: Any) -> Any:
    """The input_shapes entry that describes a call's value: a list for a sequence, None for an empty
    optional, the shape otherwise."""
    if value is None:
        return None
    if isinstance(value, list):
        return [structure_of(v) for v in value]
    return tuple(np.shape(value))


def flatten_value(name: str, value: Any) -> dict[str, np.ndarray]:
    """A call's value as the program inputs bind_structured_input made of it."""
    if value is None:
        return {}
    if isinstance(value, list):
        out: dict[str, np.ndarray] = {}
        for i, v in enumerate(value):
            out.update(flatten_value(f"{name}.{i}", v))
        return out
    return {name: np.asarray(value)}


# -- which nodes are handled here -----------------------------------------------------------------------------

def is_structured(ctx: ImportContext, node: OnnxNode) -> bool:
    """Whether a node is imported here: a sequence/optional op, or Identity/If/Loop carrying one."""
    if node.op_type in SEQUENCE_OPS:
        return True
    if node.op_type not in ("Identity", "If", "Loop"):
        return False
    if any(i in ctx.sequences or i in ctx.absent for i in node.inputs if i):
        return True
    bodies = [node.attr(k) for k in ("then_branch", "else_branch", "body") if node.attr(k) is not None]
    return any(is_structured_type(o.type) for body in bodies for o in body.output)


def _position(ctx: ImportContext, node: OnnxNode, i: int, length: int, default: int, insert: bool = False) -> int:
    arr = ctx.static(node, i, "position")
    if arr is None:
        return default
    pos = int(np.asarray(arr).reshape(-1)[0])
    hi = length if insert else length - 1
    if not -length <= pos <= hi:
        raise node.refuse(f"position {pos} is outside a sequence of length {length}")
    return pos + length if pos < 0 else pos


def _seq(ctx: ImportContext, node: OnnxNode, i: int) -> list[str]:
    name = node.inputs[i] if node.has_input(i) else ""
    if name not in ctx.sequences:
        raise node.refuse(f"input {name!r} is not a sequence known at import time")
    return list(ctx.sequences[name])


def _element(ctx: ImportContext, name: str, value: str | np.ndarray) -> str:
    """Bind an element value (IR value or constant) under a fresh ONNX name; returns the name."""
    if isinstance(value, np.ndarray):
        ctx.consts[name] = value
    else:
        ctx.values[name] = value
    return name


# -- the ops --------------------------------------------------------------------------------------------------

def sequence_empty(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    ctx.sequences[node.outputs[0]] = []


def sequence_construct(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    ctx.sequences[node.outputs[0]] = [i for i in node.inputs if i]


def sequence_at(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    seq = _seq(ctx, node, 0)
    alias(ctx, node.outputs[0], seq[_position(ctx, node, 1, len(seq), 0)])


def sequence_insert(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    seq = _seq(ctx, node, 0)
    seq.insert(_position(ctx, node, 2, len(seq), len(seq), insert=True), node.inputs[1])
    ctx.sequences[node.outputs[0]] = seq


def sequence_erase(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    seq = _seq(ctx, node, 0)
    if not seq:
        raise node.refuse("erasing from an empty sequence")
    del seq[_position(ctx, node, 1, len(seq), len(seq) - 1)]
    ctx.sequences[node.outputs[0]] = seq


def sequence_length(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    ctx.consts[node.outputs[0]] = np.array(len(_seq(ctx, node, 0)), dtype=np.int64)


def split_to_sequence(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    x = ctx.input(node, 0)
    shape = ctx.b.shape(x)
    axis = int(node.attr("axis", 0)) % len(shape)
    extent = shape[axis]
    if not isinstance(extent, int):
        raise node.refuse(f"splitting a symbolic dimension {extent} into a sequence (its length would vary)")
    split = ctx.static(node, 1, "split")
    if split is None:
        sizes, squeeze = [1] * extent, not int(node.attr("keepdims", 1))
    elif np.ndim(split) == 0:
        chunk = int(split)
        if chunk <= 0:
            raise node.refuse(f"split size {chunk}")
        sizes, squeeze = [min(chunk, extent - s) for s in range(0, extent, chunk)], False
    else:
        sizes, squeeze = [int(s) for s in np.asarray(split).reshape(-1)], False
        if sum(sizes) != extent or min(sizes, default=0) < 0:
            raise node.refuse(f"split sizes {sizes} do not add up to the axis' extent {extent}")
    elements, start = [], 0
    for i, size in enumerate(sizes):
        part = ctx.emit("slice", [x], starts=[start], ends=[start + size], axes=[axis])
        if squeeze:
            part = ctx.emit("reshape", [part], shape=[d for k, d in enumerate(shape) if k != axis])
        elements.append(_element(ctx, f"{node.outputs[0]}.{i}", part))
        start += size
    ctx.sequences[node.outputs[0]] = elements


def concat_from_sequence(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    seq = _seq(ctx, node, 0)
    if not seq:
        raise node.refuse("concatenating an empty sequence (its element type and shape are unknown)")
    values = [ctx.value(e) for e in seq]
    rank = len(ctx.b.shape(values[0]))
    new_axis = bool(node.attr("new_axis", 0))
    axis = int(node.attr("axis"))
    axis = axis % (rank + 1 if new_axis else rank)
    if new_axis:
        values = [ctx.emit("reshape", [v], shape=[*ctx.b.shape(v)[:axis], 1, *ctx.b.shape(v)[axis:]])
                  for v in values]
    ctx.values[node.outputs[0]] = values[0] if len(values) == 1 else ctx.emit("concat", values, axis=axis)


def optional(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    if node.has_input(0):
        alias(ctx, node.outputs[0], node.inputs[0])
    else:
        ctx.absent.add(node.outputs[0])


def optional_has_element(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    present = node.has_input(0) and node.inputs[0] not in ctx.absent
    ctx.consts[node.outputs[0]] = np.array(present)


def optional_get_element(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    if not node.has_input(0) or node.inputs[0] in ctx.absent:
        raise node.refuse("the optional is empty (OptionalGetElement of an empty optional is an error)")
    alias(ctx, node.outputs[0], node.inputs[0])


def identity(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    alias(ctx, node.outputs[0], node.inputs[0])


def sequence_map(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    """The body inlined once per element; the other inputs' sequences are walked in step, tensors repeat."""
    body = node.attr("body")
    first = _seq(ctx, node, 0)
    columns: list[list[str]] = []
    for name in node.inputs:
        if name in ctx.sequences:
            if len(ctx.sequences[name]) != len(first):
                raise node.refuse(f"sequences of lengths {len(first)} and {len(ctx.sequences[name])}")
            columns.append(list(ctx.sequences[name]))
        else:
            columns.append([name] * len(first))
    results: list[list[str]] = [[] for _ in node.outputs]
    prefix = node.name or node.outputs[0]
    for i in range(len(first)):
        outs = inline_graph(ctx, body, f"{prefix}/map{i}", import_into, inputs=[c[i] for c in columns])
        for k, out in enumerate(outs):
            results[k].append(out)
    for dst, elements in zip(node.outputs, results):
        ctx.sequences[dst] = elements


def structured_if(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    """An If giving a sequence or optional: the branch taken is inlined, so the condition is needed at import
    (a graph input behind it makes a value template)."""
    pred = ctx.static(node, 0, "condition")
    assert pred is not None
    taken = node.attr("then_branch") if bool(np.asarray(pred).reshape(-1)[0]) else node.attr("else_branch")
    outs = inline_graph(ctx, taken, f"{node.name or node.outputs[0]}/branch", import_into)
    for dst, src in zip(node.outputs, outs):
        if dst:
            alias(ctx, dst, src)


def structured_loop(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    """A Loop unrolled at import time (it carries a sequence or optional, or its body needs its trip counter
    as a constant): its trip count and condition must be known at import, and the condition must fold in
    every trip."""
    body = node.attr("body")
    trips = ctx.static(node, 0, "trip count")
    limit = int(np.asarray(trips).reshape(-1)[0]) if trips is not None else None
    cond_arr = ctx.static(node, 1, "condition")
    going = True if cond_arr is None else bool(np.asarray(cond_arr).reshape(-1)[0])
    carried = list(node.inputs[2:])
    k = len(carried)
    scans: list[list[str]] = [[] for _ in body.output[1 + k:]]
    prefix = node.name or node.outputs[0]
    trip = 0
    while going and (limit is None or trip < limit):
        if trip >= MAX_UNROLLED_TRIPS:
            raise node.refuse(f"a Loop unrolled at import time (it carries a sequence, or its body needs its "
                              f"counter as a constant) runs more than {MAX_UNROLLED_TRIPS} trips")
        counter, cond_in = f"{prefix}/trip{trip}/iter", f"{prefix}/trip{trip}/cond"
        ctx.consts[counter] = np.array(trip, dtype=np.int64)
        ctx.consts[cond_in] = np.array(True)
        outs = inline_graph(ctx, body, f"{prefix}/trip{trip}", import_into, inputs=[counter, cond_in, *carried])
        cond_out = ctx.const(outs[0])
        if cond_out is None:
            raise node.refuse("a Loop unrolled at import time (it carries a sequence, or its body needs its "
                              "counter as a constant) whose condition is computed at run time (the number of "
                              "trips would depend on data)")
        going = bool(np.asarray(cond_out).reshape(-1)[0])
        carried = outs[1:1 + k]
        for column, out in zip(scans, outs[1 + k:]):
            column.append(out)
        trip += 1
    for dst, src in zip(node.outputs, carried):
        if dst:
            alias(ctx, dst, src)
    for j, (dst, column) in enumerate(zip(node.outputs[k:], scans)):
        if not dst:
            continue
        if not column:
            raise node.refuse(f"scan output {j} of a Loop that ran no trips (empty, of unknown shape)")
        parts = [ctx.emit("reshape", [ctx.value(v)], shape=[1, *ctx.shape(v)]) for v in column]
        ctx.values[dst] = parts[0] if len(parts) == 1 else ctx.emit("concat", parts, axis=0)


STRUCTURED_IMPORTERS: dict[str, StructuredImporter] = {
    "SequenceEmpty": sequence_empty, "SequenceConstruct": sequence_construct, "SequenceAt": sequence_at,
    "SequenceInsert": sequence_insert, "SequenceErase": sequence_erase, "SequenceLength": sequence_length,
    "SplitToSequence": split_to_sequence, "ConcatFromSequence": concat_from_sequence,
    "SequenceMap": sequence_map, "Optional": optional, "OptionalHasElement": optional_has_element,
    "OptionalGetElement": optional_get_element, "Identity": identity, "If": structured_if,
    "Loop": structured_loop,
}
