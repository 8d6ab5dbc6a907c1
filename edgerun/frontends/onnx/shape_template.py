"""A program imported per input size at its first call: ONNX models that cannot be planned for all sizes at once.

With `from_onnx(..., unsized="symbols")` a dynamic dimension nobody sized becomes a symbol (symbols.py).
Most models then import once as a template that the runtime specialises per size. Some hold together only
for some sizes in a way the importer cannot state up front: a text recognizer whose Reshape holds only while
(H + 15) // 48 is 1, a branch whose rank depends on a length. ONNX Runtime runs those at every size where
the arithmetic works out. Rather than refusing the model, `from_onnx` then returns a ShapeTemplate: the
first call at a new combination of input shapes imports the model with those shapes pinned (a static
program, cached like any specialisation: runtime/specializing.py keys its cache on the shapes), and a size
at which the model cannot run is refused at that call, with the importer's reason.

It is a ValueSpecializer with no value-deciding inputs: `for_values` keys on the shapes alone. Saved, it is
a program file holding the ONNX model's bytes (as a saved ValueTemplate is, value_template.py); loading it
needs the onnx package, as every new size runs the importer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.frontends.onnx.importer import import_onnx_graph
from edgerun.frontends.onnx.sequences import with_output_layout
from edgerun.frontends.onnx.value_template import MODEL_CONSTANT, model_carrier
from edgerun.frontends.program_maker import make_program
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program.program import Program

SHAPE_TEMPLATE_KEY = "onnx_per_shape"  # program metadata of a saved ShapeTemplate
_PROGRAMS_KEPT = 8  # imported programs kept, one per input-shape combination (as the runtime's LRU)

ShapeKey = tuple[tuple[str, str, tuple[int, ...], bytes], ...]  # ValueKey's form: (input, "", shape, b"")


class ShapeTemplate(Program):
    """A Program imported again at each new combination of input shapes. `reason` says why one import for
    every size was not possible (the importer's refusal at symbolic sizes)."""

    def __init__(self, model: Any, specs: Mapping[str, TensorSpec], symbols: Mapping[str, tuple[int, int]],
                 constant_inputs: Mapping[str, Any] | None, optimize: bool, reason: str) -> None:
        graph = Graph()
        for name, spec in specs.items():
            graph.add_input(name, spec)
        graph.symbols = dict(symbols)
        super().__init__(graph)
        self.metadata["frontend"] = "onnx"
        self.metadata[SHAPE_TEMPLATE_KEY] = {"reason": reason}
        self.output_names = [o.name for o in model.graph.output]
        # The outputs exist per size only: named without specs, so a tool that takes this graph for a whole
        # program (interpret, quantize, verify) fails on them loudly.
        graph.outputs = [f"{o} (exists per input size: load this program with edgerun.load)" for o in self.output_names]
        self.value_inputs: list[str] = []  # ValueSpecializer: no input decides the structure by its value
        self.reason = reason
        self._model = model
        self._constant_inputs = dict(constant_inputs or {})
        self._optimize = optimize
        self._lock = threading.Lock()
        self._programs: OrderedDict[ShapeKey, Program] = OrderedDict()
        self.imports_made = 0  # the first-call cost is paid this often

    def for_values(self, inputs: Mapping[str, Any]) -> tuple[Program, ShapeKey]:
        """The static program for these inputs' shapes, imported on first use; a size the model cannot run
        at is refused here, naming the sizes and the importer's reason."""
        shapes = {n: tuple(int(d) for d in np.shape(inputs[n])) for n in self.graph.inputs}
        key: ShapeKey = tuple((n, "", shapes[n], b"") for n in self.graph.inputs)
        with self._lock:
            program = self._programs.get(key)
            if program is not None:
                self._programs.move_to_end(key)
                return program, key
        for name, shape in shapes.items():
            want = self.graph.specs[name]
            if len(shape) != want.rank or any(isinstance(w, int) and w != g for w, g in zip(want.shape, shape)):
                raise EdgerunError(f"input {name!r} has shape {shape}, the program takes {want}")
        layout: list[Any] = []
        try:
            graph = import_onnx_graph(self._model, shapes, self._constant_inputs or None, layout)
        except EdgerunError as exc:
            sizes = ", ".join(f"{n} {s}" for n, s in shapes.items())
            raise EdgerunError(f"the model cannot run at these input sizes ({sizes}): {exc}") from None
        program = with_output_layout(make_program(graph, frontend="onnx", run_passes=self._optimize), layout)
        program.metadata["specialized_from"] = {"shapes": {n: list(s) for n, s in shapes.items()}}
        with self._lock:
            self.imports_made += 1
            self._programs[key] = program
            while len(self._programs) > _PROGRAMS_KEPT:
                self._programs.popitem(last=False)
        return program, key

    def to_program(self) -> Program:
        """A program file's worth: the inputs' specs, the ONNX model's bytes and frozen inputs as constants."""
        graph, frozen = model_carrier(self.graph, self._model, self._constant_inputs)
        metadata = {**self.metadata, SHAPE_TEMPLATE_KEY: {
            "reason": self.reason, "model": MODEL_CONSTANT, "constant_inputs": frozen,
            "optimize": self._optimize, "output_names": list(self.output_names)}}
        return Program(graph, metadata)

    @staticmethod
    def from_program(program: Program) -> ShapeTemplate:
        from edgerun.frontends.onnx.loading import load_model

        saved = program.metadata.get(SHAPE_TEMPLATE_KEY)
        if not isinstance(saved, dict) or saved.get("model") not in program.graph.constants:
            raise EdgerunError(f"this program file does not hold a saved per-size ONNX model (metadata "
                               f"{SHAPE_TEMPLATE_KEY!r} and its ONNX model)")
        model = load_model(bytes(program.graph.constants[saved["model"]]))
        frozen = {k: np.asarray(program.graph.constants[c]) for k, c in saved.get("constant_inputs", {}).items()}
        specs = {n: program.graph.specs[n] for n in program.graph.inputs}
        return ShapeTemplate(model, specs, program.graph.symbols, frozen or None, bool(saved.get("optimize", True)),
                             str(saved.get("reason", "")))

    def save(self, path: Any) -> None:
        self.to_program().save(path)

    def to_bytes(self) -> bytes:
        return self.to_program().to_bytes()

    def __repr__(self) -> str:
        return f"<ShapeTemplate inputs {self.graph.inputs}, imported per input size; {len(self._programs)} imported>"
