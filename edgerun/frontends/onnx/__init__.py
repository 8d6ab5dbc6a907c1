"""The ONNX frontend: `from_onnx(path_or_model) -> Program` (see docs/onnx.md)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgerun.frontends.onnx.context import DynamicInputError, OnnxModelError
from edgerun.frontends.onnx.importer import OnnxImportError, import_onnx_graph
from edgerun.frontends.onnx.loading import load_model
from edgerun.frontends.onnx.sequences import with_output_layout
from edgerun.frontends.onnx.symbols import InputDim, InputShapeError
from edgerun.frontends.onnx.value_template import ValueTemplate
from edgerun.frontends.program_maker import make_program
from edgerun.program.program import Program

__all__ = ["InputShapeError", "OnnxImportError", "OnnxModelError", "ValueTemplate", "from_onnx", "import_onnx_graph"]


def from_onnx(source: Any, input_shapes: Mapping[str, Sequence[InputDim]] | None = None,
              constant_inputs: Mapping[str, Any] | None = None, *, optimize: bool = True,
              unsized: str = "symbols") -> Program:
    """Import an ONNX model (path, bytes or onnx.ModelProto) as an edgerun Program.

    A dynamic dimension needs nothing: it imports as a symbol of any size, and the program is specialised at
    the first call of each new size (cached; symbols.py). What the import cannot prove for every size (a
    Reshape whose counts agree only while (H + 15) // 48 is 1, a branch that runs only where a size is 1) is a
    guard in the program, checked at each new size: a size that fails it is refused at that call with the
    reason (ir/specialize.py). Where the model needs multiples (a stride-32 detector) the importer finds them.

    `input_shapes` sizes dynamic dimensions instead: an int pins one ({"input_ids": (1, 128)}), a
    `(name, min, max)` tuple keeps it symbolic within bounds ({"x": (1, 3, ("H", 32, 2048), ("W", 32, 2048))}),
    the arena then planned for the bounds and every shape in them checked upfront. `unsized="refuse"` refuses a
    dynamic dimension left unsized (DynamicInputError) for callers who want every size stated; a malformed
    `input_shapes` entry is an InputShapeError. `constant_inputs` freezes graph inputs that must be
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
        if _from_sizes(exc):
            # A number the import needs is computed from symbolic sizes (and no guard can stand in for it):
            # one program cannot hold every size, so the sizes must be given.
            exc.args = (f"{exc}; it is computed from the inputs' sizes, so this model imports with those "
                        "dimensions pinned (input_shapes=, or --input-shape on the CLI)",)
            raise
        return ValueTemplate(model, exc, input_shapes, constant_inputs, optimize, unsized)
    return with_output_layout(make_program(graph, frontend="onnx", run_passes=optimize), layout)


def _from_sizes(exc: DynamicInputError) -> bool:
    """Whether a value the import needed comes from no graph input, or only from inputs whose sizes rather than
    values it can be (rank 2 or more with a symbolic size: a Range over a feature map's width), so no value of
    a small input could stand in for it. A rank-0 or rank-1 input behind it (axes, a Reshape target, even of
    dynamic length) makes a value template."""
    if not exc.graph_inputs:
        return True
    specs = [exc.input_specs[n] for n in exc.graph_inputs if n in exc.input_specs]
    return bool(specs) and all(len(s.shape) >= 2 and not all(isinstance(d, int) for d in s.shape) for s in specs)
