"""Convert a core-ATen ExportedProgram into an edgerun Graph: inputs, weights, one handler per ATen node."""

from __future__ import annotations

import operator
from typing import Any

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.torch import (
    aten_composed_math,
    aten_creation,
    aten_elementwise,
    aten_indexing,
    aten_nn,
    aten_pooling,
    aten_reductions,
    aten_shape,
    aten_sorting,
)
from edgerun.frontends.torch.context import HANDLERS, ConvertContext
from edgerun.frontends.torch.control_flow import convert_higher_order
from edgerun.frontends.torch.source_info import module_path, node_meta, source_line
from edgerun.frontends.torch.state import StateCapture, buffer_data
from edgerun.ir.graph import Graph
from edgerun.ir.symbolic import Dim, SymbolicShapeError, same_values
from edgerun.ir.tensor_spec import TensorSpec

_HANDLER_MODULES = (aten_composed_math, aten_creation, aten_elementwise, aten_indexing, aten_nn, aten_pooling,
                    aten_reductions, aten_shape, aten_sorting)  # registration


class FrontendBugError(RuntimeError):
    """A handler produced a value whose shape differs from torch's: a bug in this frontend, not user error."""


def convert_exported_program(ep: Any, symbol_names: dict[str, str] | None = None,
                             symbols: dict[str, tuple[int, int]] | None = None,
                             state: StateCapture | None = None) -> Graph:
    """`symbol_names` maps torch's size symbols to the user's Dim names, `symbols` bounds those names
    (frontends/torch/symbols.py); both empty for a static export. `state`: which buffers are program state
    (default: those `ep` mutates, named by FQN); it receives their initial values."""
    graph = Graph(symbols=dict(symbols or {}))
    ctx = ConvertContext(graph)
    ctx.symbol_names = dict(symbol_names or {})
    sig = ep.graph_signature
    kinds = {spec.arg.name: spec for spec in sig.input_specs}
    ctx.user_outputs = set(sig.user_outputs)
    state = state if state is not None else StateCapture.of(ep)
    for node in ep.graph.nodes:
        ctx.node = node
        if node.op == "placeholder":
            spec = kinds.get(node.name)
            if spec is not None and spec.target in state.names:
                ctx.env[node] = _state_read(ctx, ep, node, spec.target, state)
            else:
                ctx.env[node] = _placeholder(ctx, ep, node, spec)
        elif node.op == "call_function":
            ctx.b.meta = node_meta(node)
            ctx.env[node] = _call(ctx, node)
        elif node.op == "output":
            graph.outputs = _outputs(ctx, node, sig)
            _state_updates(ctx, node, sig, state)
        elif node.op == "get_attr":
            ctx.env[node] = _get_attr(ctx, ep.graph_module, node)
        else:
            raise EdgerunError(f"unexpected FX node kind {node.op!r} ({node.name})")
    graph.prune_specs()
    return graph


def _get_attr(ctx: ConvertContext, module: Any, node: Any) -> Any:
    import torch

    attr = getattr(module, str(node.target))
    # A branch or body of torch.cond / while_loop / scan / map stays a GraphModule for control_flow.py.
    return attr if isinstance(attr, torch.fx.GraphModule) else ctx.const_like_torch(attr)


def convert_module(ctx: ConvertContext, gm: Any, args: list[Any]) -> list[Any]:
    """Convert a branch or body GraphModule into `ctx`, its placeholders bound to `args`; its outputs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(args):
        raise EdgerunError(f"a subgraph takes {len(placeholders)} values, its op passes {len(args)}")
    ctx.env.update(zip(placeholders, args))
    for node in gm.graph.nodes:
        ctx.node = node
        if node.op == "call_function":
            ctx.b.meta = node_meta(node)
            ctx.env[node] = _call(ctx, node)
        elif node.op == "get_attr":
            ctx.env[node] = _get_attr(ctx, gm, node)
        elif node.op == "output":
            out = node.args[0]
            return [ctx.env[o] for o in (out if isinstance(out, list | tuple) else [out])]
    raise EdgerunError("a subgraph has no output")


def _placeholder(ctx: ConvertContext, ep: Any, node: Any, spec: Any) -> Any:
    from torch.export.graph_signature import InputKind

    kind = spec.kind if spec is not None else InputKind.USER_INPUT
    if kind is InputKind.PARAMETER or kind is InputKind.BUFFER:
        data = ep.state_dict.get(spec.target) if spec.target in ep.state_dict else ep.constants[spec.target]
        return ctx.const_like_torch(data)
    if kind is InputKind.CONSTANT_TENSOR:
        return ctx.const_like_torch(ep.constants[spec.target])
    if kind is not InputKind.USER_INPUT:
        raise EdgerunError(f"exported input {node.name!r} of kind {kind.name} is not supported")
    val = node.meta.get("val")
    if not hasattr(val, "shape"):
        return val  # a Python scalar input torch.export specialised; handlers see the constant
    dtype = ctx.dtype_of_torch(val.dtype)
    try:
        shape = ctx.dims(val.shape)
    except SymbolicShapeError as exc:
        raise EdgerunError(f"input {node.name!r}: {exc}") from None
    return ctx.graph.add_input(node.name, TensorSpec(shape, dtype))


def _state_read(ctx: ConvertContext, ep: Any, node: Any, target: str, state: StateCapture) -> str:
    """A mutated buffer: a read of the state named for it (torch/state.py), its export-time value the
    state's initial value."""
    data = buffer_data(ep, target)
    dtype = ctx.dtype_of_torch(data.dtype)
    name = state.names[target]
    state.initial[name] = data.detach().cpu().contiguous().numpy().astype(dtype.np, copy=True)
    if name in ctx.graph.specs:
        raise EdgerunError(f"state {name!r} (buffer {target!r}) has the name of another value; rename the buffer")
    ctx.graph.specs[name] = TensorSpec(tuple(int(d) for d in data.shape), dtype)
    ctx.graph.state_inputs.append(name)
    return name


def _state_updates(ctx: ConvertContext, node: Any, sig: Any, state: StateCapture) -> None:
    for arg in node.args[0]:
        target = sig.buffers_to_mutate.get(getattr(arg, "name", None))
        if target is None:
            continue
        if target not in state.names:
            raise EdgerunError(f"buffer {target!r} is mutated but not declared as program state")
        name, value = state.names[target], ctx.env[arg]
        if not isinstance(value, str):
            raise EdgerunError(f"the new value of buffer {target!r} is not a tensor edgerun computes")
        ctx.graph.state_updates[name] = ctx.cast(value, ctx.graph.specs[name].dtype)


def _call(ctx: ConvertContext, node: Any) -> Any:
    if node.target is operator.getitem:
        values = ctx.env[node.args[0]]
        picked = values[int(node.args[1])]
        read = any(u.op != "output" for u in node.users) or node.name in ctx.user_outputs
        if picked is None and read:
            ctx.unsupported("reading an output this frontend does not produce")
        return picked
    from torch._ops import HigherOrderOperator

    if _computes_size(node):
        return _size_value(ctx, node)
    if isinstance(node.target, HigherOrderOperator):
        return _check_against_torch(ctx, node, convert_higher_order(ctx, node, convert_module))
    name = str(node.target)
    handler = HANDLERS.get(name)
    if handler is None:
        raise UnsupportedOpError(name, module_path=module_path(node) or None, source=source_line(node) or None,
                                 detail="no edgerun handler for this ATen op")
    if not _known_shapes(ctx, node.meta.get("val")):
        ctx.unsupported("its output shape depends on tensor values (e.g. boolean-mask indexing, nonzero); "
                        "edgerun program shapes are static or bounded symbols of the inputs")
    empty = _empty_result(ctx, node)
    if empty is not None:
        return empty
    try:
        result = handler(ctx, node)
    except SymbolicShapeError as exc:  # a rule or handler that needs a concrete size: name the op and line
        ctx.unsupported(str(exc))
    except EdgerunError:
        raise
    except ValueError as exc:  # an IR shape rule refused the arguments
        ctx.unsupported(f"arguments the IR does not accept ({exc})")
    return _check_against_torch(ctx, node, result)


def _computes_size(node: Any) -> bool:
    import torch

    return isinstance(node.meta.get("val"), (torch.SymInt, torch.SymBool, torch.SymFloat))


def _size_value(ctx: ConvertContext, node: Any) -> Dim | None:
    """A node computing a size (aten.sym_size.int, Python arithmetic on SymInts) is that size as a Dim.

    Booleans and floats over sizes are None: torch's run-time shape asserts read them, and the bounds and
    consistency they check are checked again when a template program binds its symbols.
    """
    import torch

    val = node.meta.get("val")
    if not isinstance(val, torch.SymInt):
        return None
    try:
        return ctx.dims([val])[0]
    except SymbolicShapeError as exc:
        ctx.unsupported(str(exc))


def _known_shapes(ctx: ConvertContext, val: Any) -> bool:
    """Every dimension is an int or an expression over the exported symbols (not a data-dependent size)."""
    vals = list(val) if isinstance(val, list | tuple) else [val]
    try:
        for v in vals:
            if hasattr(v, "shape"):
                ctx.dims(v.shape)
    except SymbolicShapeError:
        return False
    return True


def _empty_result(ctx: ConvertContext, node: Any) -> Any:
    """Constants for an op whose every output has zero elements: there are no values to compute."""
    import numpy as np

    val = node.meta.get("val")
    vals = list(val) if isinstance(val, list | tuple) else [val]
    # Only static shapes can be known empty (asking a symbolic size would make torch specialise it).
    if not vals or not all(hasattr(v, "shape") and all(isinstance(d, int) for d in v.shape)
                           and v.numel() == 0 for v in vals):
        return None
    consts = [ctx.b.const(np.zeros(tuple(v.shape)), ctx.dtype_of_torch(v.dtype)) for v in vals]
    return consts if isinstance(val, list | tuple) else consts[0]


def _check_against_torch(ctx: ConvertContext, node: Any, result: Any) -> Any:
    """Match each result to torch's fake tensor: cast when only the dtype differs, refuse a shape mismatch."""
    val = node.meta.get("val")
    if result is None or val is None:
        return result
    if isinstance(result, str):
        return _match(ctx, node, result, val)
    return [None if r is None else _match(ctx, node, r, v) for r, v in zip(result, val)]


def _match(ctx: ConvertContext, node: Any, value: str, val: Any) -> str:
    shape = ctx.dims(val.shape)
    if ctx.b.shape(value) != shape and not same_values(ctx.b.shape(value), shape, ctx.graph.symbols):
        raise FrontendBugError(f"{node.target} in {module_path(node)!r}: produced shape {ctx.b.shape(value)}, "
                               f"torch has {shape}")
    return ctx.cast(value, ctx.dtype_of_torch(val.dtype))


def _outputs(ctx: ConvertContext, node: Any, sig: Any) -> list[str]:
    import torch.fx

    user_outputs = set(sig.user_outputs)
    outs = []
    for arg in node.args[0]:
        if isinstance(arg, torch.fx.Node):
            if arg.name not in user_outputs:
                continue  # buffer mutations and other non-user outputs
            value = ctx.env[arg]
            if not isinstance(value, str):
                raise EdgerunError(f"model output {arg.name!r} is not a tensor; edgerun programs return tensors")
            outs.append(value)
        else:
            raise EdgerunError(f"model output {arg!r} is not a tensor (a {type(arg).__name__}); "
                               "return only tensors (a tensor, or a tuple/list/dict of tensors)")
    if not outs:
        raise EdgerunError("the model returns no tensors")
    return outs
