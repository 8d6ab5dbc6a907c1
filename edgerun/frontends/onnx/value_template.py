"""A program whose structure is decided by the values of some inputs: specialised per value at call time.

ONNX models feed structure-deciding values as graph inputs: reduction axes, Resize scales, a Reshape target,
Slice starts, Pad pads, TopK's k. The importer needs them as constants (they decide which axes go, an output
rank, an interpolation matrix), so an import without them stops at the first node that needs one. Rather
than refusing, `from_onnx` then returns a ValueTemplate: a Program whose inputs are all the model's inputs,
whose *value-deciding inputs* (small inputs such a node needs, named by the import) are bound at call time.

At the first call with new values the import runs again with those values folded in as constants (exactly
what a symbol binding does for a size: MNN reads shape-computing inputs at resize), giving an ordinary
program (static, or a shape template when the model also has symbolic dimensions). The runtime caches the
loaded result per (values, shapes) in its specialisation LRU (runtime/specializing.py): a call with other
values never reuses a specialisation made for different ones, because the key holds every value-deciding
input's bytes (ir/specialize.py: value_key). A value-deciding input may hold at most MAX_VALUE_ELEMENTS
elements; a larger one is refused naming it.

A second value-deciding input can show up only once the first is folded in (a TopK's k behind a Reshape's
target): the template learns it on that call, and from then on keys on it too.

Saved, a ValueTemplate is an ordinary program file holding what the import needs to run again: the ONNX
model's bytes (a uint8 constant, memory-mapped like weights), the frozen `constant_inputs` (constants), and
the import options (metadata "value_template"). Its graph has the inputs only. `edgerun.load(path)` (through
`from_program`) imports it again and specialises per value as `from_onnx`'s result does; that needs the
`onnx` package on the machine that loads it, as every specialisation runs the importer.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.frontends.onnx.context import DynamicInputError
from edgerun.frontends.onnx.importer import import_onnx_graph
from edgerun.frontends.onnx.loading import load_model
from edgerun.frontends.onnx.sequences import with_output_layout
from edgerun.frontends.onnx.symbols import InputDim
from edgerun.frontends.program_maker import make_program
from edgerun.ir.graph import Graph
from edgerun.ir.specialize import ValueKey, check_value_size, value_key
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program.program import Program

VALUE_TEMPLATE_KEY = "value_template"  # program metadata of a saved ValueTemplate (to_program, from_program)
MODEL_CONSTANT = "onnx_model"  # the saved ONNX model's bytes, a uint8 constant
_PROGRAMS_KEPT = 8  # imported programs kept, one per distinct value (as many as the runtime LRU loads; each holds
# its own optimised weights, so more would cost memory for values the runtime has already dropped)


def _per_value(output: str, value_inputs: list[str]) -> str:
    return (f"{output} (exists per value of inputs {value_inputs}: load this value template with "
            "edgerun.load, which specialises it per value)")


def model_carrier(inputs: Graph, model: Any, constant_inputs: Mapping[str, np.ndarray],
                  ) -> tuple[Graph, dict[str, str]]:
    """The graph a template's program file holds: `inputs`' inputs and symbols, the ONNX model's bytes as the
    constant `MODEL_CONSTANT`, and each frozen input as a constant; with the frozen inputs' constant names."""
    graph = Graph()
    for name in inputs.inputs:
        graph.add_input(name, inputs.specs[name])
    graph.symbols = dict(inputs.symbols)
    graph.add_constant(np.frombuffer(model.SerializeToString(), np.uint8), name=MODEL_CONSTANT)
    frozen = {}
    for k, (name, value) in enumerate(sorted(constant_inputs.items())):
        frozen[name] = graph.add_constant(np.ascontiguousarray(value), name=f"constant_input_{k}")
    return graph, frozen


class ValueTemplate(Program):
    """A Program specialised per value of its `value_inputs` (and per shape, when it has symbols).

    `graph` holds the inputs' specs only; `for_values(inputs)` gives the program for those values. Load it
    with `edgerun.load` and call it like any program. `save` writes the ONNX model and the import options
    into a program file, which `edgerun.load` turns back into a ValueTemplate (needs the onnx package).
    """

    def __init__(self, model: Any, error: DynamicInputError, input_shapes: Mapping[str, Sequence[InputDim]] | None,
                 constant_inputs: Mapping[str, Any] | None, optimize: bool, unsized: str = "symbols") -> None:
        graph = Graph()
        for name, spec in error.input_specs.items():
            graph.add_input(name, spec)
        graph.symbols = dict(error.symbols)
        super().__init__(graph)
        self.metadata["frontend"] = "onnx"
        self.output_names = [o.name for o in model.graph.output]
        self._model = model
        self._input_shapes = dict(input_shapes or {})
        self._constant_inputs = dict(constant_inputs or {})
        self._optimize = optimize
        self._unsized = unsized  # what the re-imports make of dimensions nobody sized (symbols.py)
        self._lock = threading.Lock()
        self._programs: OrderedDict[ValueKey, Program] = OrderedDict()
        self.value_inputs: list[str] = []
        self._learn(error)
        # The outputs exist per value only: named here without specs, so a tool that takes this graph for a
        # whole program (interpret, quantize, verify, the search) fails on them loudly, not computing nothing.
        graph.outputs = [_per_value(o.name, self.value_inputs) for o in model.graph.output]
        self.imports_made = 0  # imports run for new values (the first-call cost is paid this often)

    def _learn(self, error: DynamicInputError) -> None:
        """Add the inputs behind a value an import needed, refusing large ones; re-raise when there are none."""
        specs: dict[str, TensorSpec] = {n: self.graph.specs[n] for n in self.graph.inputs}
        new = [n for n in error.graph_inputs if n in specs and n not in self.value_inputs]
        if not new:
            raise error
        where = f" (node {error.source or error.op}, op {error.op}, needs it at import)"
        for name in new:
            shape = specs[name].shape
            if all(isinstance(d, int) for d in shape):
                check_value_size(name, shape, where)  # a symbolic size is checked against each call's value
        self.value_inputs.extend(new)
        self.metadata["value_inputs"] = list(self.value_inputs)

    def for_values(self, inputs: Mapping[str, Any]) -> tuple[Program, ValueKey]:
        """The program for these value-deciding inputs (others in `inputs` are ignored) and its cache key.

        The program's inputs are the template's inputs less the value-deciding ones, which are folded in."""
        while True:
            with self._lock:
                names = list(self.value_inputs)
            key = value_key(names, inputs)
            with self._lock:
                program = self._programs.get(key)
                if program is not None:
                    self._programs.move_to_end(key)
                    return program, key
            values = {n: np.asarray(inputs[n]) for n in names}
            for name, value in values.items():
                self._check_spec(name, value)
            layout: list[Any] = []
            try:
                graph = import_onnx_graph(self._model, {k: v for k, v in self._input_shapes.items() if k not in values},
                                          {**self._constant_inputs, **values}, layout, self._unsized)
            except DynamicInputError as exc:
                with self._lock:
                    self._learn(exc)  # another value-deciding input, seen once the first is folded in
                continue
            program = with_output_layout(make_program(graph, frontend="onnx", run_passes=self._optimize), layout)
            program.metadata["specialized_from"] = {"values": {n: values[n].tolist() for n in names}}
            with self._lock:
                self.imports_made += 1
                self._programs[key] = program
                while len(self._programs) > _PROGRAMS_KEPT:
                    self._programs.popitem(last=False)
            return program, key

    def _check_spec(self, name: str, value: np.ndarray) -> None:
        """The value's dtype, rank and static dimensions must be the input's (its symbolic ones may be any)."""
        want = self.graph.specs[name]
        fits = value.dtype == want.dtype.np and value.ndim == want.rank and all(
            not isinstance(w, int) or w == got for w, got in zip(want.shape, value.shape))
        if not fits:
            raise EdgerunError(f"input {name!r} is {value.dtype}{list(value.shape)}, the program takes {want}")

    def to_program(self) -> Program:
        """A program file's worth: the inputs, the ONNX model's bytes and frozen inputs as constants, and the
        import options as metadata (what from_program reads back)."""
        graph, frozen = model_carrier(self.graph, self._model, self._constant_inputs)
        metadata = {**self.metadata, VALUE_TEMPLATE_KEY: {
            "model": MODEL_CONSTANT, "constant_inputs": frozen, "optimize": self._optimize, "unsized": self._unsized,
            "input_shapes": {k: [list(d) if isinstance(d, tuple) else d for d in v]
                             for k, v in self._input_shapes.items()},
            "value_inputs": list(self.value_inputs), "output_names": list(self.output_names)}}
        return Program(graph, metadata)

    @staticmethod
    def from_program(program: Program) -> Program:
        """The ValueTemplate a saved one holds (the import is run again up to its first value-deciding input)."""
        saved = program.metadata.get(VALUE_TEMPLATE_KEY)
        if not isinstance(saved, dict) or saved.get("model") not in program.graph.constants:
            raise EdgerunError(f"this program file does not hold a saved value template (metadata "
                               f"{VALUE_TEMPLATE_KEY!r} and its ONNX model)")
        model = load_model(bytes(program.graph.constants[saved["model"]]))
        shapes = {k: tuple(tuple(d) if isinstance(d, list) else d for d in v)
                  for k, v in saved.get("input_shapes", {}).items()}
        frozen = {k: np.asarray(program.graph.constants[c]) for k, c in saved.get("constant_inputs", {}).items()}
        unsized = str(saved.get("unsized", "symbols"))
        try:
            graph = import_onnx_graph(model, shapes or None, frozen or None, None, unsized)
        except DynamicInputError as exc:
            return ValueTemplate(model, exc, shapes or None, frozen or None, bool(saved.get("optimize", True)),
                                 unsized)
        return make_program(graph, frontend="onnx", run_passes=bool(saved.get("optimize", True)))

    def save(self, path: Any) -> None:
        """Write a program file that `edgerun.load` specialises per value as this template does."""
        self.to_program().save(path)

    def to_bytes(self) -> bytes:
        return self.to_program().to_bytes()

    def __repr__(self) -> str:
        return (f"<ValueTemplate inputs {self.graph.inputs}, specialised per value of {self.value_inputs}; "
                f"{len(self._programs)} imported>")
