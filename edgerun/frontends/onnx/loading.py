"""Reading an ONNX model from a path, bytes or a ModelProto, and the checks that turn a bad file into a clear error."""

from __future__ import annotations

import os
from typing import Any

from edgerun.frontends.onnx.context import OnnxModelError, onnx_dtype

# ONNX opsets of the default domain we import. The spec's op semantics are handled per op version inside
# the handlers; outside this range nothing is promised, so we refuse rather than guess.
MIN_OPSET = 7


def max_opset() -> int:
    import onnx.defs
    return int(onnx.defs.onnx_opset_version())


def load_model(source: Any) -> Any:
    """A ModelProto from a path, bytes or ModelProto; external data is loaded from beside the file."""
    import onnx
    from google.protobuf.message import DecodeError

    if isinstance(source, onnx.ModelProto):
        return _names_are_text(source)
    if isinstance(source, bytes | bytearray):
        try:
            return _names_are_text(onnx.load_model_from_string(bytes(source)))
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise OnnxModelError(f"not a valid ONNX protobuf ({len(source)} bytes): {exc}") from None
    if isinstance(source, str | os.PathLike):
        path = os.fspath(source)
        if not os.path.isfile(path):
            raise OnnxModelError(f"ONNX file {path!r} does not exist")
        try:
            model = onnx.load_model(path, load_external_data=False)
        except (DecodeError, RuntimeError, ValueError) as exc:
            raise OnnxModelError(f"{path!r} is not a valid ONNX protobuf "
                                 f"(truncated or not an ONNX file?): {exc}") from None
        _load_external_data(model, os.path.dirname(os.path.abspath(path)))
        return _names_are_text(model)
    raise OnnxModelError(f"from_onnx takes a path, bytes or onnx.ModelProto, got {type(source).__name__}")


def _load_external_data(model: Any, base_dir: str) -> None:
    """Read every tensor's external data into the model, checked by us, not by onnx's loader: the real path
    of each data file (links followed) must lie inside the real model folder, wherever the tensor sits
    (the main graph, a subgraph of If/Loop/Scan, a function, a sparse tensor); absolute paths and ranges
    past the end of the file are refused. Each refusal is one OnnxModelError naming the tensor."""
    import onnx

    folder = os.path.realpath(base_dir)
    for tensor in _all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        where = info.get("location", "")
        if not where or os.path.isabs(where) or "\0" in where:
            raise OnnxModelError(f"tensor {tensor.name!r} names external data {where!r}: only a relative "
                                 "path inside the model's folder is allowed")
        real = os.path.realpath(os.path.join(folder, where))
        if os.path.commonpath([real, folder]) != folder:
            raise OnnxModelError(f"tensor {tensor.name!r} points outside the model's folder: {where!r}"
                                 + (" (through a link)" if os.path.normpath(where).split(os.sep)[0] != ".." else ""))
        if not os.path.isfile(real):
            raise OnnxModelError(f"external data file {where!r} of tensor {tensor.name!r} "
                                 f"is missing (looked in {base_dir!r})")
        tensor.raw_data = _read_range(real, where, tensor.name, info.get("offset"), info.get("length"))
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]


def _read_range(path: str, where: str, name: str, offset_text: str | None, length_text: str | None) -> bytes:
    size = os.path.getsize(path)
    try:
        offset = int(offset_text or 0)
        length = size - offset if length_text is None else int(length_text)
    except ValueError:
        raise OnnxModelError(f"tensor {name!r}: external data offset/length {offset_text!r}/{length_text!r} "
                             "are not integers") from None
    if offset < 0 or length < 0 or offset + length > size:
        raise OnnxModelError(f"tensor {name!r}: bytes {offset}..{offset + length} of {where!r} are outside "
                             f"the file ({size} bytes)")
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def _all_nodes_and_graphs(model: Any) -> tuple[list[Any], list[Any]]:
    """Every node and every graph of the model: the main graph, subgraphs at any depth, local functions'
    nodes (iteratively: a deep nest of subgraphs cannot overflow the stack)."""
    nodes: list[Any] = [n for f in model.functions for n in f.node]
    graphs, pending = [], [model.graph]
    for n in nodes:
        pending.extend(a.g for a in n.attribute if a.HasField("g"))
        pending.extend(g for a in n.attribute for g in a.graphs)
    while pending:
        g = pending.pop()
        graphs.append(g)
        for n in g.node:
            nodes.append(n)
            pending.extend(a.g for a in n.attribute if a.HasField("g"))
            pending.extend(sub for a in n.attribute for sub in a.graphs)
    return nodes, graphs


def _all_tensors(model: Any) -> list[Any]:
    """Every TensorProto of the model: initializers, sparse initializers, tensor attributes, in every graph,
    subgraph and local function."""
    nodes, graphs = _all_nodes_and_graphs(model)
    tensors: list[Any] = []
    for g in graphs:
        tensors.extend(g.initializer)
        for sp in g.sparse_initializer:
            tensors.extend((sp.values, sp.indices))
    for node in nodes:
        for a in node.attribute:
            if a.HasField("t"):
                tensors.append(a.t)
            tensors.extend(a.tensors)
            for sp in (*([a.sparse_tensor] if a.HasField("sparse_tensor") else []), *a.sparse_tensors):
                tensors.extend((sp.values, sp.indices))
    return tensors


def _names_are_text(model: Any) -> Any:
    """`model`, once every name in it is text and every tensor type known. protobuf hands a string field
    that is not valid UTF-8 back as bytes, which later comparisons with str trip over (found by
    fuzz/targets.py::onnx_model)."""
    nodes, graphs = _all_nodes_and_graphs(model)
    for n in nodes:
        for name in (n.name, n.op_type, n.domain, *n.input, *n.output, *(a.name for a in n.attribute)):
            if not isinstance(name, str):
                raise OnnxModelError(f"node {n.name if isinstance(n.name, str) else '?'!r} has a name that is "
                                     f"not valid UTF-8: {bytes(name)[:40]!r}")
    for g in graphs:
        for name in (g.name, *(v.name for v in (*g.input, *g.output, *g.value_info)),
                     *(t.name for t in g.initializer)):
            if not isinstance(name, str):
                raise OnnxModelError(f"graph has a value name that is not valid UTF-8: {bytes(name)[:40]!r}")
    _tensor_types_are_known(model)
    return model


def _tensor_types_are_known(model: Any) -> None:
    """Every tensor's data type is one edgerun holds (context.onnx_dtype; an UnsupportedOpError naming the
    type otherwise, as for inputs): onnx's own numpy_helper raises KeyError on a type ONNX does not define,
    and a type it defines but edgerun does not hold (complex, float6) failed later, inside the importer,
    with a ValueError (both found by fuzz/targets.py::onnx_model; the checker lets them through)."""
    for t in _all_tensors(model):
        onnx_dtype(t.data_type, f"tensor {t.name!r}")


def dependency_order(nodes: list[Any], known: set[str]) -> list[Any]:
    """Nodes in dependency order (ONNX requires it; a wrong order is cheap to repair). A read of a value
    nothing defines, or a cycle, is an OnnxModelError naming the nodes."""
    produced = set(known)
    ordered, pending = [], list(nodes)
    while pending:
        rest = []
        for n in pending:
            if all(not i or i in produced for i in n.input):
                ordered.append(n)
                produced.update(o for o in n.output if o)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            names = [n.name or n.op_type for n in rest[:5]]
            made_later = {o for n in rest for o in n.output}
            missing = sorted({i for n in rest for i in n.input if i and i not in produced and i not in made_later})
            if missing:
                raise OnnxModelError(f"nodes {names} read undefined values {missing[:5]} "
                                     "(a missing initializer or graph input?)")
            raise OnnxModelError(f"the graph has a cycle among nodes {names}")
        pending = rest
    return ordered


# Initializers above this many elements are replaced by typed inputs before ONNX's checker and shape
# inference, which would otherwise serialise every weight (seconds for a transformer) to read its type.
SKELETON_LIMIT = 4096


def skeleton(model: Any) -> Any:
    """The model with its large initializers turned into typed graph inputs: same types, no weight bytes."""
    import onnx
    from onnx import helper

    if all(_numel(t) <= SKELETON_LIMIT for t in model.graph.initializer):
        return model
    out = onnx.ModelProto()
    for field in ("ir_version", "producer_name", "producer_version", "domain", "model_version"):
        setattr(out, field, getattr(model, field))
    out.opset_import.extend(model.opset_import)
    out.functions.extend(model.functions)
    g, src = out.graph, model.graph
    g.name = src.name
    g.node.extend(src.node)
    g.output.extend(src.output)
    g.value_info.extend(src.value_info)
    declared = {vi.name for vi in src.input}
    g.input.extend(src.input)
    for t in src.initializer:
        if _numel(t) <= SKELETON_LIMIT:
            g.initializer.append(t)
        elif t.name not in declared:
            g.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    return out


def _numel(t: Any) -> int:
    n = 1
    for d in t.dims:
        n *= int(d)
    return n


def _same_as_min_opset(graph: Any, opset: int) -> None:
    """An opset below MIN_OPSET imports when every default-domain op it uses (subgraphs included) has the
    definition it has at MIN_OPSET (Not, Abs, Relu ... unchanged since opset 1); otherwise the refusal names
    the first op whose semantics differed then (old broadcasting, consumed_inputs, ...)."""
    import onnx.defs

    for node in graph.node:
        if (node.domain or "ai.onnx") == "ai.onnx":
            try:
                old = onnx.defs.get_schema(node.op_type, opset).since_version
                now = onnx.defs.get_schema(node.op_type, MIN_OPSET).since_version
            except onnx.defs.SchemaError:
                old, now = -1, 0
            if old != now:
                raise OnnxModelError(f"ONNX opset {opset} is outside the supported range {MIN_OPSET}..{max_opset()}"
                                     f" and {node.op_type} was defined differently then")
        for a in node.attribute:
            for sub in (a.g, *a.graphs) if a.type in (5, 10) else ():
                _same_as_min_opset(sub, opset)


def check_model(model: Any) -> int:
    """Our structural checks, then ONNX's checker; returns the default-domain opset version."""
    import onnx

    g = model.graph
    dependency_order(list(g.node), {v.name for v in g.input} | {t.name for t in g.initializer})

    versions = {o.domain or "ai.onnx": int(o.version) for o in model.opset_import}
    if "ai.onnx" not in versions:
        if any((n.domain or "ai.onnx") == "ai.onnx" for n in g.node):
            raise OnnxModelError("model imports no version of the default ONNX domain (opset_import)")
        versions["ai.onnx"] = max_opset()  # an ai.onnx.ml-only model uses no default-domain op
    opset = versions["ai.onnx"]
    if opset < MIN_OPSET:
        _same_as_min_opset(g, opset)
    elif opset > max_opset():
        raise OnnxModelError(f"ONNX opset {opset} is outside the supported range {MIN_OPSET}..{max_opset()}")
    try:
        onnx.checker.check_model(skeleton(model))
    except (onnx.checker.ValidationError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OnnxModelError(f"invalid ONNX model: {first}") from None
    return opset


def infer_types(model: Any) -> dict[str, Any]:
    """ONNX's own shape inference: value name -> TypeProto, used to cross-check the shapes we infer."""
    import onnx

    try:
        model = skeleton(model)
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True, data_prop=True)
    except (onnx.shape_inference.InferenceError, RuntimeError):
        # Strict inference also fails on gaps in ONNX's own rules; the lenient pass still gives the types it
        # can, and our shape rules check every node anyway.
        try:
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
        except (onnx.shape_inference.InferenceError, RuntimeError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OnnxModelError(f"ONNX shape inference rejects the model: {first}") from None
    g = inferred.graph
    return {v.name: v.type for v in (*g.value_info, *g.output, *g.input)}
