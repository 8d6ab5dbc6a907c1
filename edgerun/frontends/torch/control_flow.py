"""torch's higher-order control flow as the IR's control-flow ops: torch.cond -> cond, torch.while_loop ->
while_loop, torch scan -> scan, torch.map (map_impl) -> scan with no carried values.

torch.export gives each branch or body as a GraphModule (a get_attr) whose placeholders take the operands;
each becomes a closed IR graph converted by the same ATen handlers. An operand that is a constant here (a
weight, a folded tensor) becomes a constant of the body, so it still folds there (a weight's transpose); a
run-time operand becomes a body input and an input of the node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from edgerun.frontends.torch.context import ConvertContext
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import add_subgraph

# Converts a GraphModule's nodes into a context, its placeholders bound to the given values; returns its
# outputs (convert.py's node walk).
ConvertModule = Callable[[ConvertContext, Any, list[Any]], list[Any]]


def convert_higher_order(ctx: ConvertContext, node: Any, convert_module: ConvertModule) -> list[str]:
    name = getattr(node.target, "name", lambda: str(node.target))()
    converter = _CONVERTERS.get(name)
    if converter is None:
        ctx.unsupported(f"higher-order op {name!r} (torch.cond, torch.while_loop, scan and torch.map convert)")
    return converter(ctx, node, convert_module)


def _module(ctx: ConvertContext, arg: Any) -> Any:
    import torch

    gm = ctx.env.get(arg)
    if not isinstance(gm, torch.fx.GraphModule):
        ctx.unsupported(f"expected a subgraph (GraphModule) argument, got {type(gm).__name__}")
    return gm


def _values(ctx: ConvertContext, args: Sequence[Any]) -> list[str]:
    return [ctx.v(a) for a in args]


def _body(ctx: ConvertContext, gm: Any, carried: Sequence[str], operands: Sequence[str],
          convert_module: ConvertModule, inner: Sequence[tuple[int, ...]] = ()) -> Graph:
    """A closed graph of `gm`: inputs for `carried` (always) and for the run-time `operands` (constants become
    body constants). `inner`: shapes that replace the carried specs (a scan step sees one slice)."""
    child = ConvertContext(Graph(symbols=dict(ctx.graph.symbols)))
    child.user_outputs = ctx.user_outputs
    child.symbol_names = ctx.symbol_names
    args: list[Any] = []
    for j, v in enumerate(carried):
        spec = ctx.graph.specs[v]
        if j < len(inner):
            spec = type(spec)(inner[j], spec.dtype)
        args.append(child.graph.add_input(f"in{j}", spec))
    for j, v in enumerate(operands):
        if v in ctx.graph.constants:
            args.append(child.graph.add_constant(ctx.graph.constants[v], hint="operand"))
        else:
            args.append(child.graph.add_input(f"op{j}", ctx.graph.specs[v]))
    outs = convert_module(child, gm, args)
    if not all(isinstance(o, str) for o in outs):
        ctx.unsupported("a branch or body returns something other than tensors")
    child.graph.outputs = list(outs)
    child.graph.prune_specs()
    return child.graph


def _runtime(ctx: ConvertContext, values: Sequence[str]) -> list[str]:
    return [v for v in values if v not in ctx.graph.constants]


def _emit(ctx: ConvertContext, op: str, inputs: list[str], **attrs: Any) -> list[str]:
    try:
        return ctx.b.emit_multi(op, inputs, **attrs)
    except ValueError as exc:  # a shape rule: the bodies do not fit the node
        ctx.unsupported(str(exc))


def _cond(ctx: ConvertContext, node: Any, convert_module: ConvertModule) -> list[str]:
    pred, true_fn, false_fn, operands = node.args[:4]
    values = _values(ctx, operands)
    names = [add_subgraph(ctx.graph, _body(ctx, _module(ctx, fn), [], values, convert_module), side)
             for fn, side in ((true_fn, "then"), (false_fn, "else"))]
    p = ctx.v(pred)
    if ctx.b.spec(p).numel != 1 or ctx.b.dtype(p).value != "bool":
        ctx.unsupported(f"torch.cond predicate must be a one-element bool tensor, got {ctx.b.spec(p)}")
    return _emit(ctx, "cond", [p, *_runtime(ctx, values)], then=names[0], **{"else": names[1]})


def _while_loop(ctx: ConvertContext, node: Any, convert_module: ConvertModule) -> list[str]:
    cond_fn, body_fn, carried, additional = node.args[:4]
    carried_values, extra = _values(ctx, carried), _values(ctx, additional)
    names = [add_subgraph(ctx.graph, _body(ctx, _module(ctx, fn), carried_values, extra, convert_module), hint)
             for fn, hint in ((cond_fn, "cond"), (body_fn, "body"))]
    return _emit(ctx, "while_loop", [*carried_values, *_runtime(ctx, extra)], cond=names[0], body=names[1],
                 num_carried=len(carried_values))


def _scan(ctx: ConvertContext, node: Any, convert_module: ConvertModule) -> list[str]:
    combine, init, xs, additional = node.args[:4]
    carried, sequences, extra = _values(ctx, init), _values(ctx, xs), _values(ctx, additional)
    return _scan_node(ctx, _module(ctx, combine), carried, sequences, extra, convert_module)


def _map(ctx: ConvertContext, node: Any, convert_module: ConvertModule) -> list[str]:
    body, xs, pos_args = node.args[:3]
    return _scan_node(ctx, _module(ctx, body), [], _values(ctx, xs), _values(ctx, pos_args), convert_module)


def _scan_node(ctx: ConvertContext, gm: Any, carried: list[str], sequences: list[str], extra: list[str],
               convert_module: ConvertModule) -> list[str]:
    if not sequences:
        ctx.unsupported("a scan over no sequences")
    length = ctx.b.shape(sequences[0])[0]
    steps = [ctx.b.shape(v) for v in carried] + [ctx.b.shape(v)[1:] for v in sequences]
    body = _body(ctx, gm, [*carried, *sequences], extra, convert_module, inner=steps)
    name = add_subgraph(ctx.graph, body, "scan")
    return _emit(ctx, "scan", [*carried, *sequences, *_runtime(ctx, extra)], body=name, num_carried=len(carried),
                 num_sequences=len(sequences), length=length)


_CONVERTERS = {"cond": _cond, "while_loop": _while_loop, "scan": _scan, "map_impl": _map}
