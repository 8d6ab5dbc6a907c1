"""The ONNX frontend: `from_onnx(path_or_model) -> Program` (see docs/onnx.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgerun.frontends.onnx.context import DynamicInputError, OnnxModelError, ShapeBoundsError
from edgerun.frontends.onnx.importer import OnnxImportError, import_onnx_graph, unsized_input_specs
from edgerun.frontends.onnx.loading import load_model
from edgerun.frontends.onnx.sequences import with_output_layout
from edgerun.frontends.onnx.shape_template import ShapeTemplate
from edgerun.frontends.onnx.symbols import InputDim
from edgerun.frontends.onnx.value_template import ValueTemplate
from edgerun.frontends.program_maker import make_program
from edgerun.program.program import Program

__all__ = ["OnnxImportError", "OnnxModelError", "ShapeTemplate", "ValueTemplate", "from_onnx", "import_onnx_graph"]


def from_onnx(source: Any, input_shapes: Mapping[str, Sequence[InputDim]] | None = None,
              constant_inputs: Mapping[str, Any] | None = None, *, optimize: bool = True,
              unsized: str = "refuse") -> Program:
    """Import an ONNX model (path, bytes or onnx.ModelProto) as an edgerun Program.

    `input_shapes` sizes the inputs' dynamic dimensions: an int pins one ({"input_ids": (1, 128)}), a
    `(name, min, max)` tuple keeps it symbolic within bounds ({"x": (1, 3, ("H", 32, 2048), ("W", 32, 2048))}),
    and the program then serves every shape in the bounds. A dynamic dimension given neither is refused, or
    with `unsized="symbols"` imports as a symbol of any size, the program specialised at the first call of
    each new size (symbols.py); a model that cannot be planned for every size at once is then a ShapeTemplate,
    imported again at the first call of each new size and refusing, at that call, a size it cannot run at
    (shape_template.py). `constant_inputs` freezes graph inputs that must be
    static (a Reshape target fed as an input) to given values. With `optimize` (the default) the default pass
    pipeline runs, as for `edgerun.export` (make_program).

    A model that feeds a structure-deciding value as a small graph input (reduction axes, Resize scales, a
    Reshape target) gives a ValueTemplate: the program is specialised per value of those inputs at call time
    and cached (value_template.py); `constant_inputs` instead freezes them once, and saves as one program.

    Sequence and optional inputs take their structure from `input_shapes` (a list of element shapes; None for
    an empty optional) and become one input per tensor, `<name>.<i>` for a sequence's elements; sequence
    outputs become their elements, grouped back by metadata "onnx_outputs" (sequences.py, docs/onnx.md).
    """
    model = load_model(source)
    layout: list[Any] = []
    try:
        graph = import_onnx_graph(model, input_shapes, constant_inputs, layout, unsized)
    except DynamicInputError as exc:
        if unsized == "symbols" and _from_sizes(exc):
            return _per_size(model, input_shapes, constant_inputs, optimize, exc)
        if not exc.graph_inputs:
            raise  # the value is computed from no graph input (a control-flow body's): nothing to bind
        return ValueTemplate(model, exc, input_shapes, constant_inputs, optimize, unsized)
    except ShapeBoundsError as exc:
        if unsized != "symbols":
            raise
        return _per_size(model, input_shapes, constant_inputs, optimize, exc)
    return with_output_layout(make_program(graph, frontend="onnx", run_passes=optimize), layout)


def _from_sizes(exc: DynamicInputError) -> bool:
    """Whether a value the import needed comes from an input with a symbolic size (a Range over a feature
    map's width): its sizes decide it, so the model is imported per size rather than per value."""
    return not exc.graph_inputs or any(not all(isinstance(d, int) for d in exc.input_specs[n].shape)
                                       for n in exc.graph_inputs if n in exc.input_specs)


def _per_size(model: Any, input_shapes: Mapping[str, Sequence[InputDim]] | None,
              constant_inputs: Mapping[str, Any] | None, optimize: bool, exc: Exception) -> Program:
    """Not plannable for every size at once: imported per input size at the first call of each."""
    specs, symbols = unsized_input_specs(model, input_shapes, constant_inputs)
    return ShapeTemplate(model, specs, symbols, constant_inputs, optimize, str(exc))
