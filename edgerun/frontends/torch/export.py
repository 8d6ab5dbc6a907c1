"""The PyTorch frontend's entry points: a torch.nn.Module and example inputs in, a Graph or Program out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgerun.errors import EdgerunError
from edgerun.frontends.program_maker import make_program
from edgerun.frontends.torch.capture import capture
from edgerun.frontends.torch.convert import convert_exported_program
from edgerun.frontends.torch.state import StateCapture
from edgerun.ir.graph import Graph
from edgerun.ir.verifier import verify

if TYPE_CHECKING:
    from edgerun.program.program import Program

DYNAMIC_SHAPES_MESSAGE = (
    "dynamic_shapes is not supported yet (torch.export.Dim bounds are not taken): edgerun programs are "
    "specialised to the shapes of the example inputs. What works "
    "today: export once per input shape you need (e.g. one program per sequence length), or pad inputs to a "
    "fixed shape; Python branches on shapes are resolved for the example shapes. torch.cond and "
    "torch.while_loop cannot be converted yet either.")


def export_graph(module: Any, args: tuple[Any, ...], dynamic_shapes: Any = None, *,
                 kwargs: dict[str, Any] | None = None, initial_state: dict[str, Any] | None = None) -> Graph:
    """Capture `module` on `args` with torch.export and convert it to a verified edgerun Graph.

    Buffers `forward` mutates become state (frontends/torch/state.py); their export-time values go into
    `initial_state` when given.

    Raises ExportFailedError when torch.export cannot capture the model, UnsupportedOpError naming the ATen
    op, module path and source line when the graph uses an op edgerun cannot express.
    """
    if dynamic_shapes is not None:
        raise EdgerunError(DYNAMIC_SHAPES_MESSAGE)
    if not isinstance(args, tuple):
        args = (args,)
    ep = capture(module, args, kwargs)
    state = StateCapture.of(ep)
    graph = convert_exported_program(ep, state)
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
