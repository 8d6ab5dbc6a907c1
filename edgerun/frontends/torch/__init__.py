"""PyTorch frontend: torch.export -> core ATen -> edgerun IR.

    program = edgerun.frontends.torch.export(model, (example_input,))
    graph = edgerun.frontends.torch.export_graph(model, (example_input,))
    program = edgerun.frontends.torch.export_methods(model, {"prefill": ("prefill", args), ...})

Programs are specialised to the example inputs' shapes, unless `dynamic_shapes` names bounded
`torch.export.Dim`s: then the program is a template over those symbols, specialised per shape at run time.
"""

from edgerun.frontends.torch.capture import ExportFailedError
from edgerun.frontends.torch.export import export, export_graph
from edgerun.frontends.torch.methods import export_methods
from edgerun.frontends.torch.supported import supported_aten_ops

__all__ = ["ExportFailedError", "export", "export_graph", "export_methods", "supported_aten_ops"]
