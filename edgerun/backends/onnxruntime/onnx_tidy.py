"""Tidying an emitted ONNX graph before ORT sees it: Reshapes that leave the shape as it was are dropped,
and an Expand whose only reader is a Reshape adding leading unit axes expands to that shape itself.

The raster readings work on flat and refined views, so a raster that is a plain concat or slice arrives
wrapped in Reshapes to the shape it already has. ORT keeps each as a node (about a microsecond a call each,
most of a tiny model's time: DIN's 37 ops reached ORT as 19 Reshapes among 52 nodes). ONNX's shape
inference says which ones change nothing; their consumers read the input instead.
"""

from __future__ import annotations

from typing import Any

from edgerun.backends.onnxruntime.onnx_ops import reads


def drop_noop_reshapes(model: Any) -> None:
    """Remove, in place, every Reshape whose input and output have the same static shape. Its consumers read
    its input instead; when it writes a graph output, the input's producer writes that output directly."""
    import onnx

    graph = model.graph
    if not any(n.op_type == "Reshape" for n in graph.node):
        return
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:  # inference is an optimisation here: without it the graph stays as it is
        return
    shapes = {v.name: _static_shape(v) for v in [*inferred.value_info, *inferred.input, *inferred.output]}
    shapes.update({t.name: tuple(t.dims) for t in graph.initializer})
    outputs = {v.name for v in graph.output}
    # Values If/Loop/Scan bodies read by name from this graph: renaming never reaches inside a body.
    read_by_bodies = {name for n in graph.node for name in reads(n) - set(n.input)}
    fixed = outputs | {v.name for v in graph.input} | {t.name for t in graph.initializer} | read_by_bodies
    rename: dict[str, str] = {}
    dropped: set[int] = set()

    def final(name: str) -> str:
        while name in rename:
            name = rename[name]
        return name

    for k, node in enumerate(graph.node):
        if node.op_type != "Reshape" or shapes.get(node.input[0]) is None:
            continue
        src, dst = final(node.input[0]), node.output[0]  # a reshape of a dropped one reads what that read
        if shapes[node.input[0]] != shapes.get(dst) or dst in read_by_bodies:
            continue
        if dst not in outputs:
            rename[dst] = src
        elif src not in fixed:
            rename[src] = dst  # the producer writes the output itself
        else:
            continue
        dropped.add(k)
    if not dropped:
        return
    keep = [n for k, n in enumerate(graph.node) if k not in dropped]
    for node in keep:
        for k, name in enumerate(node.input):
            node.input[k] = final(name)
        for k, name in enumerate(node.output):
            node.output[k] = final(name)
    del graph.node[:]
    graph.node.extend(keep)
    used = {name for node in keep for name in node.input} | read_by_bodies
    for tensor in [t for t in graph.initializer if t.name not in used]:
        graph.initializer.remove(tensor)


def fold_expand_reshapes(model: Any) -> None:
    """Expand(x, s) read only by Reshape(., [1, ..., 1, *s]) becomes Expand(x, [1, ..., 1, *s]): ONNX's
    Expand broadcasts right-aligned, so the leading unit axes come out of the Expand itself. A broadcast
    piece of a raster is read as Reshape to its broadcastable shape, Expand, then Reshape to where the
    concat wants it: DIN's feature rows reached ORT as 4 Expand + Reshape pairs (the exporter's: none)."""
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    readers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in reads(node):
            readers.setdefault(name, []).append(node)
    outputs = {v.name for v in graph.output}
    dropped: set[str] = set()  # Reshape outputs now written by their Expand
    for node in graph.node:
        if node.op_type != "Expand" or node.output[0] in outputs:
            continue
        after = readers.get(node.output[0], [])
        if len(after) != 1 or after[0].op_type != "Reshape" or after[0].input[0] != node.output[0]:
            continue
        reshape = after[0]
        target, wanted = _ints(constants.get(node.input[1])), _ints(constants.get(reshape.input[1]))
        if target is None or wanted is None or min(wanted, default=1) < 1 or len(wanted) < len(target) \
                or wanted[len(wanted) - len(target):] != target or any(n != 1 for n in wanted[:len(wanted) - len(target)]):
            continue
        node.input[1] = reshape.input[1]
        node.output[0] = reshape.output[0]
        dropped.add(reshape.output[0])
    if dropped:
        keep = [n for n in graph.node if not (n.op_type == "Reshape" and n.output[0] in dropped)]
        del graph.node[:]
        graph.node.extend(keep)
        used = {name for n in keep for name in reads(n)}
        for tensor in [t for t in graph.initializer if t.name not in used]:  # the Expands' old shapes
            graph.initializer.remove(tensor)


def _ints(tensor: Any) -> list[int] | None:
    if tensor is None:
        return None
    from onnx import numpy_helper

    return [int(v) for v in numpy_helper.to_array(tensor).reshape(-1)]


def _static_shape(value: Any) -> tuple[int, ...] | None:
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    dims = tensor.shape.dim
    if not all(d.HasField("dim_value") for d in dims):
        return None
    return tuple(d.dim_value for d in dims)
