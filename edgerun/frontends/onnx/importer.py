"""ModelProto -> edgerun Graph: initializers become constants, nodes dispatch to handlers by op type.

Ops without a handler whose ONNX schema defines a function body (LayerNormalization, Attention, ...) are
expanded into that body and imported node by node. Nodes whose inputs are all known at import time are
folded at import time by their own handler and the reference kernels, which is how Shape -> Gather -> Reshape
chains become static.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.onnx.context import (
    DTYPE_TO_ONNX,
    Handler,
    ImportContext,
    OnnxImportError,
    OnnxModelError,
    OnnxNode,
    onnx_dtype,
)
from edgerun.frontends.onnx.control_flow import CONTROL_FLOW_IMPORTERS
from edgerun.frontends.onnx.dims import describe, disagreement, symbol_bindings
from edgerun.frontends.onnx.functions import expand_function, has_function
from edgerun.frontends.onnx.loading import check_model, dependency_order, infer_types, load_model
from edgerun.frontends.onnx.registry import load_handlers
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret


class CheckedTypes(dict[str, Any]):
    """ONNX's inferred types by value name, and the symbols input_shapes pinned (see dims.py)."""

    def __init__(self, types: Mapping[str, Any], bindings: Mapping[str, int]) -> None:
        super().__init__(types)
        self.bindings = dict(bindings)


# Ops that must never be folded at import time: their value is not a function of their inputs.
NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}


def import_onnx_graph(source: Any, input_shapes: Mapping[str, Sequence[int]] | None = None,
                      constant_inputs: Mapping[str, Any] | None = None) -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) as an edgerun Graph.

    `input_shapes` pins dynamic input dimensions (e.g. {"input_ids": (1, 128)}); without it a symbolic
    dimension is refused, because every edgerun value has a static shape. `constant_inputs` freezes graph
    inputs to values (e.g. a Reshape target fed as an input), which then stop being program inputs.
    """
    model = load_model(source)
    opset = check_model(model)
    bindings = symbol_bindings(model.graph.input, input_shapes or {})
    if input_shapes:
        model = _pin_input_shapes(model, input_shapes)
    types = CheckedTypes(infer_types(model), bindings)
    handlers = load_handlers()
    graph = Graph()
    ctx = ImportContext(graph)
    g = model.graph
    _add_initializers(ctx, g.initializer)
    input_names = {vi.name for vi in g.input}
    for name, value in (constant_inputs or {}).items():
        if name not in input_names:
            raise OnnxModelError(f"constant_inputs names {name!r}, which is not a graph input")
        ctx.consts[name] = np.asarray(value)
    for vi in g.input:
        if vi.name not in ctx.consts:
            graph.add_input(vi.name, input_spec(vi))
            ctx.values[vi.name] = vi.name
    opsets = {o.domain or "": int(o.version) for o in model.opset_import}
    opsets[""] = opset
    _import_nodes(ctx, list(g.node), opsets, types, handlers, depth=0)
    for out in g.output:
        if not ctx.known(out.name):
            raise OnnxModelError(f"graph output {out.name!r} is not produced by any node")
        graph.outputs.append(ctx.value(out.name))
    graph.prune_specs()
    from edgerun.ir.verifier import verify
    verify(graph)
    return graph


def _pin_input_shapes(model: Any, input_shapes: Mapping[str, Sequence[int]]) -> Any:
    import onnx
    model = onnx.ModelProto.FromString(model.SerializeToString())
    # value_info the exporter stored describes the shapes it saw (often batch 1); ONNX's inference recomputes
    # it from the pinned inputs, so a stale declaration cannot fail the cross-check.
    del model.graph.value_info[:]
    names = {vi.name for vi in model.graph.input}
    for name in input_shapes:
        if name not in names:
            raise OnnxModelError(f"input_shapes names {name!r}, which is not a graph input ({sorted(names)})")
    for vi in model.graph.input:
        if vi.name in input_shapes:
            dims = vi.type.tensor_type.shape.dim
            shape = [int(d) for d in input_shapes[vi.name]]
            if len(dims) != len(shape):
                raise OnnxModelError(f"input_shapes[{vi.name!r}] has rank {len(shape)}, the model {len(dims)}")
            for d, n in zip(dims, shape):
                d.Clear()
                d.dim_value = n
    return model


def _add_initializers(ctx: ImportContext, initializers: Any) -> None:
    from onnx import numpy_helper
    for t in initializers:
        try:
            ctx.consts[t.name] = numpy_helper.to_array(t)
        except (ValueError, TypeError) as exc:
            raise OnnxModelError(f"initializer {t.name!r} cannot be decoded: {exc}") from None


def input_spec(vi: Any) -> TensorSpec:
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        raise UnsupportedOpError(f"input {vi.name}", detail=f"{kind} inputs are not supported (tensors only)")
    tt = vi.type.tensor_type
    dtype = onnx_dtype(tt.elem_type, f"input {vi.name}")
    if not tt.HasField("shape"):
        raise UnsupportedOpError(f"input {vi.name}", detail="input has no shape; pass input_shapes=")
    dims = list(tt.shape.dim)
    dynamic = [i for i, d in enumerate(dims) if not d.HasField("dim_value") or d.dim_value < 0]
    if dynamic:
        said = describe(dims)
        which = (f"dimension {dynamic[0]} is dynamic ({said[dynamic[0]]!r})" if len(dynamic) == 1 else
                 "dimensions " + ", ".join(f"{i} ({said[i]!r})" for i in dynamic) + " are dynamic")
        example = tuple(f"<dim {i}>" if i in dynamic else str(s) for i, s in enumerate(said))
        raise UnsupportedOpError(f"input {vi.name}", detail=(
            f"{which}; "
            f"edgerun programs have static shapes: pass input_shapes={{{vi.name!r}: ({', '.join(example)})}} "
            "to from_onnx or --input-shape on the CLI"))
    shape = [int(d.dim_value) for d in dims]
    return TensorSpec(tuple(shape), dtype)


def _decode_attrs(node: Any) -> dict[str, Any]:
    from onnx import helper
    attrs = {}
    for a in node.attribute:
        if a.ref_attr_name:
            continue
        attrs[a.name] = helper.get_attribute_value(a)
        if isinstance(attrs[a.name], bytes):
            attrs[a.name] = attrs[a.name].decode("utf-8", "replace")
    return attrs


def _import_nodes(ctx: ImportContext, nodes: list[Any], opsets: dict[str, int], types: CheckedTypes,
                  handlers: dict[str, Any], depth: int) -> None:
    for proto in dependency_order(nodes, set(ctx.values) | set(ctx.consts)):
        domain = proto.domain if proto.domain != "ai.onnx" else ""
        if domain not in ("",) and f"{domain}:{proto.op_type}" not in handlers:
            raise UnsupportedOpError(proto.op_type, source=proto.name or None,
                                     detail=f"domain {domain!r} is not supported (only the default ONNX domain, "
                                            "and com.microsoft MatMulNBits)")
        node = OnnxNode(proto.op_type, domain, opsets.get(domain, opsets[""]), list(proto.input),
                        list(proto.output), _decode_attrs(proto), proto.name)
        ctx.b.meta = {"onnx_op": node.op_type, "onnx_node": node.name or node.outputs[0]}
        ctx.producers.update({o: [i for i in node.inputs if i] for o in node.outputs if o})
        if node.op_type in CONTROL_FLOW_IMPORTERS:
            def import_into(target: ImportContext, body: list[Any]) -> None:
                _import_nodes(target, body, opsets, types, handlers, depth + 1)
            CONTROL_FLOW_IMPORTERS[node.op_type](ctx, node, import_into)
            continue
        handler = handlers.get(f"{domain}:{node.op_type}" if domain else node.op_type)
        if handler is not None and _try_fold(ctx, node, handler):
            continue
        if handler is None:
            if depth < 8 and has_function(node.op_type, node.version):
                body, body_opsets = expand_function(ctx, proto, node.version, f"{node.name or node.outputs[0]}")
                _import_nodes(ctx, body, {**opsets, **body_opsets}, types, handlers, depth + 1)
                continue
            raise node.refuse("no ONNX import handler for this op")
        try:
            outs = handler(ctx, node)
        except EdgerunError:
            raise
        except ValueError as exc:
            raise OnnxImportError(f"importing {node.op_type} node {node.name or node.outputs[0]!r}: {exc}") from exc
        _bind_outputs(ctx, node, outs, types)


def _bind_outputs(ctx: ImportContext, node: OnnxNode, outs: list[Any], types: CheckedTypes) -> None:
    for name, out in zip(node.outputs, outs):
        if not name:
            continue
        if isinstance(out, np.ndarray):
            ctx.consts[name] = out
        else:
            ctx.values[name] = out
        _cross_check(ctx, node, name, types.get(name), types.bindings)
    missing = [n for n in node.outputs[len(outs):] if n]
    if missing:
        raise node.refuse(f"outputs {missing} are not supported")


def _cross_check(ctx: ImportContext, node: OnnxNode, name: str, t: Any, bindings: Mapping[str, int]) -> None:
    """Our inferred shape and dtype must agree with ONNX's wherever ONNX's is known.

    A dimension ONNX leaves unknown (no value, -1, 0 as converters write it, a symbol it made up) agrees
    with any size; only two known, different sizes (or a pinned input symbol and another size) disagree.
    """
    if t is None or t.WhichOneof("value") != "tensor_type":
        return
    tt = t.tensor_type
    shape, dtype = ctx.shape(name), ctx.dtype(name)
    if tt.elem_type and DTYPE_TO_ONNX.get(dtype) != tt.elem_type and name not in ctx.consts:
        raise OnnxImportError(f"{node.op_type} output {name!r}: edgerun gives {dtype.value}, "
                              f"ONNX infers element type {tt.elem_type}")
    if not tt.HasField("shape"):
        return
    why = disagreement(shape, tt.shape.dim, bindings)
    if why:
        raise OnnxImportError(f"{node.op_type} output {name!r}: edgerun infers shape {tuple(shape)}, "
                              f"ONNX infers {describe(tt.shape.dim)} ({why})")


def _try_fold(ctx: ImportContext, node: OnnxNode, handler: Handler) -> bool:
    """Evaluate a node at import time when every input is a constant, with our own handler and kernels."""
    present = [i for i in node.inputs if i]
    if node.op_type in NO_FOLD or not present or not all(i in ctx.consts for i in present):
        return False
    scratch = ImportContext(Graph())
    scratch.consts = {i: ctx.consts[i] for i in present}
    scratch.b.meta = dict(ctx.b.meta)
    try:
        outs = handler(scratch, node)
        names = [o for o in outs if isinstance(o, str)]
        scratch.graph.outputs = names
        values = dict(zip(names, interpret(scratch.graph, []))) if names else {}
    except (EdgerunError, ValueError):
        return False  # the regular path imports it into the graph or reports the problem
    for name, out in zip(node.outputs, outs):
        if name:
            ctx.consts[name] = values[out] if isinstance(out, str) else out
    return len(outs) >= len([o for o in node.outputs if o])
