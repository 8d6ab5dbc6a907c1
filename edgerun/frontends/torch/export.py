"""The PyTorch frontend's entry points: a torch.nn.Module and example inputs in, a Graph or Program out."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgerun.errors import EdgerunError
from edgerun.frontends.torch.capture import capture
from edgerun.frontends.torch.convert import convert_exported_program
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
                 kwargs: dict[str, Any] | None = None) -> Graph:
    """Capture `module` on `args` with torch.export and convert it to a verified edgerun Graph.

    Raises ExportFailedError when torch.export cannot capture the model, UnsupportedOpError naming the ATen
    op, module path and source line when the graph uses an op edgerun cannot express.
    """
    if dynamic_shapes is not None:
        raise EdgerunError(DYNAMIC_SHAPES_MESSAGE)
    if not isinstance(args, tuple):
        args = (args,)
    ep = capture(module, args, kwargs)
    graph = convert_exported_program(ep)
    verify(graph)
    return graph


def export(module: Any, args: tuple[Any, ...], dynamic_shapes: Any = None, *, name: str | None = None,
           kwargs: dict[str, Any] | None = None, optimize: bool = True) -> Program:
    """Export a torch.nn.Module to an edgerun Program (graph, weights, metadata); save it with .save(path).

    With `optimize` (the default) the passes' default pipeline runs first (decompose, fold, merge rasters)
    and its per-pass op counts go into the metadata; without it the program holds the frontend's graph,
    composite ops and all.
    """
    graph = export_graph(module, args, dynamic_shapes, kwargs=kwargs)
    return program_from_graph(graph, name=name or type(module).__name__, optimize=optimize)


def program_from_graph(graph: Graph, *, name: str, optimize: bool = True) -> Program:
    """Wrap an exported graph as a Program, optionally running the default pass pipeline first."""
    from edgerun.program.program import Program, default_metadata

    metadata = default_metadata()
    metadata["name"] = name
    metadata["frontend"] = f"torch {_torch_version()}"
    if optimize:
        from edgerun.passes.pipeline import METADATA_KEY, records_to_json
        from edgerun.passes.pipeline import optimize as run_passes

        graph, records = run_passes(graph)
        metadata[METADATA_KEY] = records_to_json(records)
    return Program(graph, metadata)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)
