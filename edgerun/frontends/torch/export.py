"""The PyTorch frontend's entry points: a torch.nn.Module and example inputs in, a Graph or Program out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgerun.frontends.program_maker import make_program
from edgerun.frontends.torch.capture import capture
from edgerun.frontends.torch.convert import convert_exported_program
from edgerun.frontends.torch.state import StateCapture
from edgerun.frontends.torch.symbols import check_dynamic_shapes, per_input_specs, symbol_names
from edgerun.ir.graph import Graph
from edgerun.ir.verifier import verify

if TYPE_CHECKING:
    from edgerun.program.program import Program

def export_graph(module: Any, args: tuple[Any, ...], dynamic_shapes: Any = None, *,
                 kwargs: dict[str, Any] | None = None, initial_state: dict[str, Any] | None = None) -> Graph:
    """Capture `module` on `args` with torch.export and convert it to a verified edgerun Graph.

    Buffers `forward` mutates become state (frontends/torch/state.py); their export-time values go into
    `initial_state` when given.
    `dynamic_shapes` is torch.export's: per input, {axis: torch.export.Dim(name, min=, max=)}. Each Dim
    becomes a bounded symbol of the graph (named as the Dim), and the graph a template that the runtime
    specialises per concrete shape. A Dim without max is refused: memory is planned for the shapes allowed.

    Raises ExportFailedError when torch.export cannot capture the model, UnsupportedOpError naming the ATen
    op, module path and source line when the graph uses an op edgerun cannot express.
    """
    if not isinstance(args, tuple):
        args = (args,)
    if dynamic_shapes is not None:
        check_dynamic_shapes(dynamic_shapes)
        specs = per_input_specs(module, args, kwargs, dynamic_shapes)
    ep = capture(module, args, kwargs, dynamic_shapes)
    state = StateCapture.of(ep)
    if dynamic_shapes is None:
        graph = convert_exported_program(ep, state=state)
    else:
        user_inputs = [n for n in ep.graph.nodes if n.op == "placeholder"
                       and n.name in set(ep.graph_signature.user_inputs)]
        names, bounds = symbol_names(ep, user_inputs, specs)
        graph = convert_exported_program(ep, names, bounds, state=state)
    verify(graph)
    if initial_state is not None:
        initial_state.update(state.initial)
    return graph


def export(module: Any, args: tuple[Any, ...], dynamic_shapes: Any = None, *, name: str | None = None,
           kwargs: dict[str, Any] | None = None, optimize: bool = True) -> Program:
    """Export a torch.nn.Module to an edgerun Program (graph, weights, metadata); save it with .save(path).

    Buffers `forward` mutates become program state (`model.reset_state()` at run time); several entry
    points at once: export_methods. With `optimize` (the default) the passes' default pipeline runs first (decompose, fold, merge rasters)
    and its per-pass op counts go into the metadata; without it the program holds the frontend's graph,
    composite ops and all.
    """
    initial_state: dict[str, Any] = {}
    graph = export_graph(module, args, dynamic_shapes, kwargs=kwargs, initial_state=initial_state)
    return make_program(graph, frontend=f"torch {torch_version()}", name=name or type(module).__name__,
                        run_passes=optimize, state=initial_state)


def torch_version() -> str:
    import torch

    return str(torch.__version__)
