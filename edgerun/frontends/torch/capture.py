"""Capture: torch.export with our choice of decompositions, and clear errors when capture itself fails."""

from __future__ import annotations

from typing import Any

from edgerun.errors import EdgerunError
from edgerun.frontends.torch.body_state import in_place_writes

# Ops the core-ATen table would decompose but that map one-to-one onto our composites; keeping them makes
# the graph smaller and lets backends see attention, linear layers and activations whole.
KEEP_WHOLE = (
    "aten.scaled_dot_product_attention.default",
    "aten.linear.default",
    "aten.silu.default",
    "aten.hardswish.default",
    "aten.hardsigmoid.default",
    "aten.rms_norm.default",
)


class ExportFailedError(EdgerunError):
    """torch.export could not capture the model (data-dependent control flow, unsupported Python, ...)."""


def decomposition_table() -> Any:
    import torch

    table = torch.export.default_decompositions()
    for key in list(table.keys()):
        if str(key) in KEEP_WHOLE:
            table.pop(key)
    return table


def capture(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
            dynamic_shapes: Any = None) -> Any:
    """The ExportedProgram of `module` on `args`, lowered to core ATen (minus KEEP_WHOLE)."""
    import torch

    module = module.eval()
    try:
        with torch.no_grad():
            ep = torch.export.export(module, tuple(args), kwargs=kwargs or None, dynamic_shapes=dynamic_shapes)
    except Exception as exc:  # torch raises many unrelated types here; all mean "capture failed"
        raise ExportFailedError(_explain(exc)) from exc
    from edgerun.frontends.torch.body_state import functionalize_cond_buffer_writes

    functionalize_cond_buffer_writes(ep)  # buffers a cond branch writes in place: out of place, copied back
    refuse_state_written_in_bodies(ep)  # any other write in a body
    try:
        return ep.run_decompositions(decomposition_table())
    except Exception as exc:
        raise ExportFailedError(f"torch.export captured the model but could not decompose it: "
                                f"{type(exc).__name__}: {_first_lines(exc)}") from exc


STATE_IN_BODY_FIX = ("return the new value from the body and assign it outside, e.g. `y, new = torch.cond(pred, "
                     "lambda x, t: (x + 1, t + 1), lambda x, t: (x - 1, t.clone()), (x, self.total)); "
                     "self.total.copy_(new)` (for torch.while_loop, carry it: `..., t = torch.while_loop(cond, "
                     "body, (..., self.total)); self.total.copy_(t)`); reading a buffer inside a body works as it is")

# Where each higher-order op's bodies find their operands: (argument positions of the operand tuples).
_BODY_OPERANDS = {"cond": (3,), "while_loop": (2, 3)}


def refuse_state_written_in_bodies(ep: Any) -> None:
    """ExportFailedError naming the body and the buffer when a control-flow body mutates one in place: the
    IR's bodies are closed, functional graphs, and torch's own decomposition cannot functionalise it
    either ("aten.copy_ is not functional")."""
    import torch

    buffers = dict(ep.graph_signature.inputs_to_buffers)
    for node in ep.graph_module.graph.nodes:
        hop = getattr(node.target, "__name__", "") if node.op == "call_function" else ""
        if not isinstance(node.target, torch._ops.HigherOrderOperator):
            continue
        operands = [a for k in _BODY_OPERANDS.get(hop, ()) if k < len(node.args)
                    for a in (node.args[k] if isinstance(node.args[k], (list, tuple)) else [node.args[k]])]
        for arg in node.args:
            if not (isinstance(arg, torch.fx.Node) and arg.op == "get_attr"):
                continue
            body = getattr(ep.graph_module, str(arg.target))
            placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
            for inner, actual in in_place_writes(body)[:1]:
                what = (f"its input {getattr(actual, 'name', actual)!r}" if actual in placeholders else
                        f"{getattr(actual, 'name', actual)!r}, a view computed in the body")
                if actual in placeholders and placeholders.index(actual) < len(operands):
                    outer = operands[placeholders.index(actual)]
                    if getattr(outer, "name", None) in buffers:
                        what = f"buffer {buffers[outer.name]!r}"
                raise ExportFailedError(
                    f"torch.{hop} body {arg.target!r} writes {what} in place ({inner.target}): state "
                    f"written inside a control-flow body is not supported. How to fix: {STATE_IN_BODY_FIX}")


def _first_lines(exc: BaseException, n: int = 6) -> str:
    return "\n".join(str(exc).strip().splitlines()[:n])


def _explain(exc: BaseException) -> str:
    text = str(exc)
    name = type(exc).__name__
    hint = ("make the forward pass traceable by torch.export: no Python control flow that depends on tensor "
            "values (branch with torch.cond, loop with torch.while_loop, or select with torch.where), no "
            ".item()/.tolist() on tensors, no data-dependent output shapes, and no unsupported Python side "
            "effects")
    if "data-dependent" in text or "GuardOnDataDependent" in name or "Could not guard" in text:
        hint = ("the model branches on tensor values (data-dependent control flow) in Python, which torch.export "
                "cannot capture: write the branch as torch.cond(pred, true_fn, false_fn, operands) and a loop "
                "as torch.while_loop(cond_fn, body_fn, carried) (edgerun converts both), or select with "
                "torch.where(cond, a, b) when both sides are valid for every input")
    if "input mutation during higher order op tracing" in text:
        hint = f"a torch.cond / torch.while_loop body writes a tensor in place: {STATE_IN_BODY_FIX}"
    if "Constraints violated" in text:
        hint = ("a dimension given a torch.export.Dim is fixed by the model, or only some of its range works: "
                "export with example sizes that are neither 0 nor 1 (torch specialises those), narrow the Dim's "
                "min/max as torch suggests above, or leave that dimension static")
    return f"torch.export failed to capture the model ({name}): {_first_lines(exc)}\nHow to fix: {hint}"
