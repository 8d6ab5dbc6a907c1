"""The ONNX frontend: `from_onnx(path_or_model) -> Program` (see docs/onnx.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgerun.frontends.onnx.context import OnnxModelError
from edgerun.frontends.onnx.importer import OnnxImportError, import_onnx_graph
from edgerun.frontends.onnx.symbols import InputDim
from edgerun.frontends.program_maker import make_program
from edgerun.program.program import Program

__all__ = ["OnnxImportError", "OnnxModelError", "from_onnx", "import_onnx_graph"]


def from_onnx(source: Any, input_shapes: Mapping[str, Sequence[InputDim]] | None = None,
              constant_inputs: Mapping[str, Any] | None = None, *, optimize: bool = True) -> Program:
    """Import an ONNX model (path, bytes or onnx.ModelProto) as an edgerun Program.

    `input_shapes` sizes the inputs' dynamic dimensions: an int pins one ({"input_ids": (1, 128)}), a
    `(name, min, max)` tuple keeps it symbolic within bounds ({"x": (1, 3, ("H", 32, 2048), ("W", 32, 2048))}),
    and the program then serves every shape in the bounds. `constant_inputs` freezes graph inputs that must be
    static (a Reshape target fed as an input) to given values. With `optimize` (the default) the default pass
    pipeline runs, as for `edgerun.export` (make_program).
    """
    graph = import_onnx_graph(source, input_shapes, constant_inputs)
    return make_program(graph, frontend="onnx", run_passes=optimize)
