"""ModelProto -> edgerun Graph: initializers become constants, nodes dispatch to handlers by op type.

Ops without a handler whose ONNX schema defines a function body (LayerNormalization, Attention, ...) are
expanded into that body and imported node by node. Nodes whose inputs are all known at import time are
folded at import time by their own handler and the reference kernels, which is how Shape -> Gather -> Reshape
chains become static.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.onnx.context import (
    DTYPE_TO_ONNX,
    ONNX_TO_DTYPE,
    DynamicInputError,
    Handler,
    ImportContext,
    OnnxImportError,
    OnnxModelError,
    OnnxNode,
    ShapeBoundsError,
    onnx_dtype,
)
from edgerun.frontends.onnx.control_flow import CONTROL_FLOW_IMPORTERS, outer_reads
from edgerun.frontends.onnx.dims import describe, disagreement
from edgerun.frontends.onnx.flex_attention import import_flex_attention
from edgerun.frontends.onnx.functions import expand_function, has_function
from edgerun.frontends.onnx.loading import check_model, dependency_order, infer_types, load_model
from edgerun.frontends.onnx.narrow_float import BFLOAT16_REFUSAL, import_via_float32
from edgerun.frontends.onnx.ort_domains import move_ort_default_domain_ops
from edgerun.frontends.onnx.registry import load_handlers
from edgerun.frontends.onnx.sequences import (
    STRUCTURED_IMPORTERS,
    bind_structured_input,
    flatten_output,
    is_structured,
    is_structured_type,
)
from edgerun.frontends.onnx.symbols import UNSIZED, DeclaredInputs, InputDim, declare_inputs
from edgerun.frontends.onnx.symfold import fold_symbolic, is_symbolic
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.symbolic import Dim, SymbolicShapeError, SymDim, sym
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret


class CheckedTypes(dict[str, Any]):
    """ONNX's inferred types by value name, and what input_shapes made of ONNX's dim_params (see dims.py)."""

    def __init__(self, types: Mapping[str, Any], bindings: Mapping[str, Dim],
                 declared_outputs: frozenset[str] = frozenset()) -> None:
        super().__init__(types)
        self.bindings = dict(bindings)
        # The graph's outputs: a shape declared there that the computation contradicts is a mistake in the
        # declaration (an exporter's stale annotation); ONNX Runtime warns and returns what is computed.
        self.declared_outputs = declared_outputs


# Ops with graph attributes, imported with access to the node importer (for their bodies), by domain:op.
BODY_IMPORTERS = {**CONTROL_FLOW_IMPORTERS, "ai.onnx.preview:FlexAttention": import_flex_attention}

# Ops that must never be folded at import time: their value is not a function of their inputs.
NO_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"}


def import_onnx_graph(source: Any, input_shapes: Mapping[str, Sequence[InputDim]] | None = None,
                      constant_inputs: Mapping[str, Any] | None = None, layout: list[Any] | None = None,
                      unsized: str = "symbols") -> Graph:
    """Import an ONNX model (path, bytes or ModelProto) as an edgerun Graph.

    `input_shapes` sizes the inputs' dynamic dimensions: an int pins one, a `(name, min, max)` tuple keeps it
    symbolic within bounds (`{"x": (1, 3, ("H", 32, 2048), ("W", 32, 2048))}`, see symbols.py); a dynamic
    dimension given neither imports as a symbol of any size (symbols.py; on multiples of the smallest of 2, 4,
    ..., 64 that imports, where the model needs them; relations that hold only at some sizes as guards checked
    per size), or with `unsized="refuse"` is refused. `constant_inputs` freezes graph inputs to values (e.g. a Reshape
    target fed as an input), which then stop being program inputs.

    A sequence or optional input takes its structure from `input_shapes` too (sequences.py): a list of element
    shapes, or None for an empty optional; it becomes one program input per tensor. Its outputs likewise
    become their tensors, and `layout`, when given, receives one [name, kind, count] per ONNX output to group
    them back (sequences.group_outputs).
    """
    if unsized not in UNSIZED:
        raise ValueError(f"unsized must be one of {UNSIZED}, got {unsized!r}")
    model = move_ort_default_domain_ops(load_model(source))
    opset = check_model(model)
    frozen = set(constant_inputs or {}) | {t.name for t in model.graph.initializer}
    declared = declare_inputs(model.graph.input, input_shapes or {}, frozen, unsized)
    try:
        return _import_declared(model, opset, declared, input_shapes, constant_inputs, layout)
    except ShapeBoundsError as exc:
        if not declared.defaulted:
            raise
        first = exc
    # A relation that holds only on multiples (a stride-32 detector's adds): if the largest multiple tried
    # imports, halve it while it still does (a multiple of one that works works too; a divisor of one that
    # fails fails too), so a model divisibility cannot help costs one retry.
    found: tuple[Graph, list[Any]] | None = None
    for multiple in DIVISIBILITY_TRIES:
        retry = declare_inputs(model.graph.input, input_shapes or {}, frozen, unsized, multiple)
        entries: list[Any] = []
        try:
            found = _import_declared(model, opset, retry, input_shapes, constant_inputs, entries), entries
        except ShapeBoundsError:
            break
    if found is None:
        # No multiple helps: a relation that holds at some sizes only (a Reshape whose counts agree while
        # (H + 15) // 48 is 1) becomes a guard the program checks at each new size (ir/specialize.py).
        entries = []
        try:
            found = _import_declared(model, opset, declared, input_shapes, constant_inputs, entries, True), entries
        except ShapeBoundsError:
            raise first from None
    if layout is not None:
        layout.extend(found[1])
    return found[0]


# Multiples tried, in this order, for dimensions nobody sized when the model does not import for every size.
DIVISIBILITY_TRIES = (64, 32, 16, 8, 4, 2)


def _import_declared(model: Any, opset: int, declared: DeclaredInputs,
                     input_shapes: Mapping[str, Sequence[InputDim]] | None, constant_inputs: Mapping[str, Any] | None,
                     layout: list[Any] | None, guarded: bool = False) -> Graph:
    g = model.graph
    if input_shapes or declared.rewritten:
        constants = {k: tuple(np.shape(v)) for k, v in (constant_inputs or {}).items()}
        model = declared.apply(model, constants)
        g = model.graph
    bindings = {**declared.bindings, **{name: sym(name) for name in declared.symbols}}
    types = CheckedTypes(infer_types(model), bindings, frozenset(o.name for o in g.output))
    handlers = load_handlers()
    graph = Graph()
    graph.symbols.update(declared.symbols)
    ctx = ImportContext(graph)
    ctx.guarded = guarded
    _add_initializers(ctx, g.initializer)
    input_names = {vi.name for vi in g.input}
    for name, value in (constant_inputs or {}).items():
        if name not in input_names:
            raise OnnxModelError(f"constant_inputs names {name!r}, which is not a graph input")
        ctx.bind_constant(name, np.asarray(value))
    for vi in g.input:
        if not ctx.known(vi.name) and is_structured_type(vi.type):
            bind_structured_input(ctx, vi, input_shapes or {})
        elif not ctx.known(vi.name):
            graph.add_input(vi.name, input_spec(vi, declared.shapes.get(vi.name)))
            ctx.values[vi.name] = vi.name
    opsets = {o.domain or "": int(o.version) for o in model.opset_import}
    opsets[""] = opset
    try:
        _import_nodes(ctx, list(g.node), opsets, types, handlers, depth=0)
    except DynamicInputError as exc:
        # Which graph inputs the needed value comes from, and their specs: a value template (value_template.py)
        # specialises on those inputs' values at call time.
        exc.graph_inputs = tuple(ctx.inputs_behind(exc.value_name))
        exc.input_specs = {n: graph.specs[n] for n in graph.inputs}
        exc.symbols = dict(graph.symbols)
        raise
    for out in g.output:
        if not ctx.known(out.name) and out.name not in ctx.sequences and out.name not in ctx.absent:
            raise OnnxModelError(f"graph output {out.name!r} is not produced by any node")
        values, entry = flatten_output(ctx, out.name)
        graph.outputs.extend(values)
        if layout is not None:
            layout.append(entry)
    graph.prune_specs()
    from edgerun.ir.verifier import verify
    verify(graph)
    return graph


def _add_initializers(ctx: ImportContext, initializers: Any) -> None:
    from onnx import numpy_helper
    for t in initializers:
        try:
            ctx.bind_constant(t.name, numpy_helper.to_array(t))
        except (ValueError, TypeError) as exc:
            raise OnnxModelError(f"initializer {t.name!r} cannot be decoded: {exc}") from None


def input_spec(vi: Any, shape: tuple[Dim, ...] | None) -> TensorSpec:
    """A graph input's spec from its declared shape (declare_inputs resolved every dynamic dimension)."""
    kind = vi.type.WhichOneof("value")
    if kind != "tensor_type":
        raise UnsupportedOpError(f"input {vi.name}", detail=f"{kind} inputs are not supported (tensors only)")
    tt = vi.type.tensor_type
    dtype = onnx_dtype(tt.elem_type, f"input {vi.name}")
    if shape is None:
        raise UnsupportedOpError(f"input {vi.name}", detail="input has no shape; pass input_shapes=")
    return TensorSpec(shape, dtype)


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
    for proto in dependency_order(nodes, set(ctx.values) | set(ctx.consts) | set(ctx.sequences) | ctx.absent):
        domain = proto.domain if proto.domain != "ai.onnx" else ""
        key = f"{domain}:{proto.op_type}" if domain else proto.op_type
        if domain not in ("",) and key not in handlers and key not in BODY_IMPORTERS:
            detail = "no import handler for this ai.onnx.ml op (SVMs and others are not supported; " \
                "docs/onnx.md)" if domain == "ai.onnx.ml" else \
                f"domain {domain!r} is not supported (only the default ONNX domain, the numeric ops of " \
                "ai.onnx.ml, and the com.microsoft ops ONNX Runtime's tools emit; docs/onnx.md lists them)" \
                if domain != "com.microsoft" else "no import handler for this com.microsoft op (docs/onnx.md " \
                "lists those that import)"
            raise UnsupportedOpError(proto.op_type, source=proto.name or None, detail=detail)
        node = OnnxNode(proto.op_type, domain, opsets.get(domain, opsets[""]), list(proto.input),
                        list(proto.output), _decode_attrs(proto), proto.name)
        ctx.b.meta = {"onnx_op": node.op_type, "onnx_node": node.name or node.outputs[0]}
        # What each output is computed from, bodies' reads of this scope included (for inputs_behind).
        reads = [i for i in node.inputs if i] + [r for v in node.attrs.values() if hasattr(v, "node")
                                                 for r in outer_reads(v)]
        ctx.producers.update({o: reads for o in node.outputs if o})
        def import_into(target: ImportContext, body: list[Any]) -> None:
            _import_nodes(target, body, opsets, types, handlers, depth + 1)
        if is_structured(ctx, node):  # sequences and optionals resolve at import time (sequences.py)
            STRUCTURED_IMPORTERS[node.op_type](ctx, node, import_into)
            continue
        if key in BODY_IMPORTERS:
            try:
                BODY_IMPORTERS[key](ctx, node, import_into)
            except DynamicInputError as exc:
                if key != "Loop" or ctx.known(exc.value_name):
                    raise
                # The body needs, at import time, a value computed from the trip counter (a Slice start):
                # unrolled, each trip's counter is a constant; its trip count must then be known at import
                # (a graph input behind it makes a value template).
                STRUCTURED_IMPORTERS["Loop"](ctx, node, import_into)
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
            outs = import_via_float32(ctx, node, handler)  # bfloat16 elementwise ops (narrow_float.py)
            if outs is None:
                outs = handler(ctx, node)
        except SymbolicShapeError as exc:
            raise node.refuse(f"{exc}; this op needs that size at import time: pin the dimension in "
                              "input_shapes= (an int instead of (name, min, max))") from None
        except EdgerunError:
            raise
        except (ValueError, TypeError) as exc:
            if _symbolic_inputs(ctx, node):
                # Over symbolic sizes a shape rule fails when it cannot prove two sizes agree for every shape
                # in the bounds (n6 against a split into 2 + 4), or a handler needs a number (np.arange(n)).
                raise node.refuse_at_bounds(f"{exc}: this holds at only some of the sizes the bounds allow, or edgerun "
                                            "cannot prove it holds at all of them, so no one plan serves them: "
                                            "narrow the bounds or pin the dimensions in input_shapes=") from None
            narrow = _narrow_inputs(ctx, node)
            if narrow:
                # bfloat16, float8, int4, ... are storage types (ir/dtypes.py): an op whose rule needs a float
                # input is refused, named, rather than reported as a bug
                why = BFLOAT16_REFUSAL if narrow == "bfloat16" else \
                    "edgerun does no float arithmetic in the narrow types (cast to float32 around it)"
                raise UnsupportedOpError(node.op_type, source=node.name or node.outputs[0],
                                         detail=f"{node.op_type} on {narrow}: {why}") from None
            if isinstance(exc, TypeError):
                raise
            raise OnnxImportError(f"importing {node.op_type} node {node.name or node.outputs[0]!r}: {exc}") from exc
        _bind_outputs(ctx, node, outs, types)


def _bind_outputs(ctx: ImportContext, node: OnnxNode, outs: list[Any], types: CheckedTypes) -> None:
    for name, out in zip(node.outputs, outs):
        if not name:
            continue
        if isinstance(out, np.ndarray):
            ctx.bind_constant(name, out)
        else:
            ctx.values[name] = out
        _cross_check(ctx, node, name, types.get(name), types.bindings, name in types.declared_outputs)
    missing = [n for n in node.outputs[len(outs):] if n]
    if missing:
        raise node.refuse(f"outputs {missing} are not supported")


def _cross_check(ctx: ImportContext, node: OnnxNode, name: str, t: Any, bindings: Mapping[str, Dim],
                 graph_output: bool = False) -> None:
    """Our inferred shape and dtype must agree with ONNX's wherever ONNX's is known.

    A dimension ONNX leaves unknown (no value, -1, 0 as converters write it, a symbol it made up) agrees
    with any size; only two known, different sizes (or a pinned input symbol and another size) disagree.
    A graph output whose declared shape disagrees is a warning (ONNX Runtime's behaviour): the program
    returns what the graph computes.
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
    if why and graph_output:
        warnings.warn(f"graph output {name!r} is declared {describe(tt.shape.dim)} but the graph computes "
                      f"{tuple(shape)} ({why}); the program returns the computed shape", stacklevel=2)
    elif why:
        raise OnnxImportError(f"{node.op_type} output {name!r}: edgerun infers shape {tuple(shape)}, "
                              f"ONNX infers {describe(tt.shape.dim)} ({why})")


def _try_fold(ctx: ImportContext, node: OnnxNode, handler: Handler) -> bool:
    """Evaluate a node at import time when every input is a constant, with our own handler and kernels."""
    present = [i for i in node.inputs if i]
    if node.op_type in NO_FOLD or not present or not all(i in ctx.consts for i in present):
        return False
    if any(is_symbolic(ctx.consts[i]) for i in present):
        return _fold_symbolic(ctx, node)
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
            ctx.bind_constant(name, values[out] if isinstance(out, str) else out)
    return len(outs) >= len([o for o in node.outputs if o])


def _fold_symbolic(ctx: ImportContext, node: OnnxNode) -> bool:
    """Shape arithmetic over symbolic dimensions, folded at import time (symfold.py) where it can be."""
    outs = fold_symbolic(ctx, node)
    if outs is None:
        if node.op_type == "Cast" and ONNX_TO_DTYPE.get(int(node.attr("to", 1)), DType.int64).is_float:
            ctx.float_sizes[node.outputs[0]] = ctx.consts[node.inputs[0]]
        return False  # computed at run time from the materialised dimensions
    dtype = ctx.dtype(node.inputs[0])
    if node.op_type == "Cast":
        dtype = ONNX_TO_DTYPE.get(int(node.attr("to")), dtype)
    for name, out in zip(node.outputs, outs):
        if name:
            ctx.consts[name] = out
            if is_symbolic(out):
                ctx.symbolic_dtypes[name] = dtype
    return True


def _narrow_inputs(ctx: ImportContext, node: OnnxNode) -> str:
    """The narrow element types (bfloat16, float8, ...) a node reads, comma-separated; '' when none."""
    found = {ctx.dtype(n).value for n in node.inputs if n and ctx.known(n) and ctx.dtype(n).is_narrow}
    return ", ".join(sorted(found))


def _symbolic_inputs(ctx: ImportContext, node: OnnxNode) -> bool:
    """Whether a node reads a value of symbolic shape, or symbolic sizes as a value."""
    for name in node.inputs:
        if not name or not ctx.known(name):
            continue
        if is_symbolic(ctx.consts.get(name)) or any(isinstance(d, SymDim) for d in ctx.shape(name)):
            return True
    return False
