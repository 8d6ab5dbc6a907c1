"""edgerun as an `onnx.backend.base.Backend`, so ONNX's own test runner and node cases can drive it.

ONNX models often feed shape-like values (Reshape's target, Slice's starts, reduction axes) as graph
inputs. `from_onnx` makes such a model a ValueTemplate (value_template.py): imported once, specialised per
value of those inputs at each call (cached per value), as the runtime does; `rep.value_inputs` names them.
The backend freezes no input: a model the template cannot serve (the value comes from no graph input, e.g.
inside a control-flow body) is refused, as `from_onnx` refuses it.

With `symbolic_dims=True` the input dimensions are made bounded symbols before import, as an exporter with
dynamic axes would write them (one symbol per distinct size, sizes 0 and 1 static): one template program
serves every input shape, and each call binds the symbols from its inputs' shapes and runs the
specialisation for them (edgerun.ir.specialize).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx.backend.base import Backend, BackendRep

from edgerun.frontends.onnx import from_onnx
from edgerun.frontends.onnx.sequences import (
    OUTPUT_LAYOUT_KEY,
    flatten_value,
    group_outputs,
    is_structured_type,
    structure_of,
)
from edgerun.frontends.onnx.value_template import ValueTemplate
from edgerun.ir.staging import has_data_dependent
from edgerun.oracle import interpret


def _input_names(model: Any) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    return [vi.name for vi in model.graph.input if vi.name not in inits]


def _structured_inputs(model: Any) -> list[str]:
    """The graph inputs of sequence or optional type."""
    return [n for n in _input_names(model) for vi in model.graph.input
            if vi.name == n and is_structured_type(vi.type)]


def _dynamic_tensor_inputs(model: Any) -> list[str]:
    """The tensor graph inputs with a dimension the model leaves without a size."""
    return [vi.name for vi in model.graph.input if vi.name in _input_names(model)
            and vi.type.WhichOneof("value") == "tensor_type"
            and any(not d.HasField("dim_value") for d in vi.type.tensor_type.shape.dim)]


# Bounds of the symbols symbolic_dims declares (node cases are small); sizes 0 and 1 stay static.
SYMBOL_BOUNDS = (2, 1 << 16)


def symbolic_input_model(model: Any) -> tuple[Any, dict[str, tuple[Any, ...]]]:
    """`model` with its input dimensions symbolic, and the input_shapes that declares the symbols' bounds.

    As an exporter with dynamic axes names them: one symbol per distinct size (`n4` for every dimension of 4,
    so the two operands of an Add keep one shape), and sizes 0 and 1 static, as torch.export specialises
    them (a size-1 dimension broadcasts, which a symbol that might be 5 could not).
    """
    import onnx

    model = onnx.ModelProto.FromString(model.SerializeToString())
    shapes: dict[str, tuple[Any, ...]] = {}
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits or vi.type.WhichOneof("value") != "tensor_type" or \
                not vi.type.tensor_type.HasField("shape"):
            continue
        dims: list[Any] = []
        for d in vi.type.tensor_type.shape.dim:
            if not d.HasField("dim_value") or d.dim_value <= 1:
                dims.append(None)
                continue
            name = f"n{d.dim_value}"
            dims.append((name, *SYMBOL_BOUNDS))
            d.Clear()
            d.dim_param = name
        shapes[vi.name] = tuple(dims)
    return model, shapes


class EdgerunBackendRep(BackendRep):
    """An imported program: static, a template over symbols, or a ValueTemplate (specialised per value)."""

    def __init__(self, model: Any, program: Any, input_shapes: dict[str, Any] | None = None) -> None:
        self.model = model
        self.program = program  # None when the model takes a sequence or optional: imported per structure
        self._specialised: dict[Any, Any] = {}
        self._input_shapes = dict(input_shapes or {})
        self._per_structure: dict[str, Any] = {}

    def _program_for(self, values: dict[str, Any]) -> Any:
        """The program itself, or for sequence / optional inputs the one imported for these values' structure
        (their lengths and element shapes, whether an optional is empty), cached per structure."""
        if self.program is not None:
            return self.program
        structures = {n: structure_of(values[n]) for n in _structured_inputs(self.model)}
        # Beside a sequence (an import per structure anyway), a tensor input's undeclared dims take the call's
        # sizes, as the elements' do.
        for n in _dynamic_tensor_inputs(self.model):
            if n in values:
                declared = self._input_shapes.get(n) or (None,) * np.ndim(values[n])
                structures[n] = tuple(size if d is None else d for d, size in zip(declared, np.shape(values[n])))
        key = repr(sorted(structures.items()))
        if key not in self._per_structure:
            self._per_structure[key] = from_onnx(self.model, optimize=False,
                                                 input_shapes={**self._input_shapes, **structures})
        return self._per_structure[key]

    @property
    def value_inputs(self) -> tuple[str, ...]:
        """Inputs whose values the program is specialised on at each call (a ValueTemplate's)."""
        return tuple(self.program.value_inputs) if isinstance(self.program, ValueTemplate) else ()

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        """The outputs as ONNX gives them: arrays, a list per sequence output, None per empty optional."""
        names = _input_names(self.model)
        if isinstance(inputs, dict):
            given = dict(inputs)
        else:
            seq = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            given = dict(zip(names, seq))
        program = self._program_for(given)
        values: dict[str, np.ndarray] = {}
        for k, v in given.items():  # a sequence is one program input per element (sequences.py)
            values.update(flatten_value(k, v) if isinstance(v, list) or v is None else {k: np.asarray(v)})
        value_key: Any = ()
        if isinstance(program, ValueTemplate):
            program, value_key = program.for_values(values)
        graph = program.graph
        if has_data_dependent(graph):  # run in stages, each specialised to its shapes (ir/staging.py)
            flat = interpret(graph, {n: values[n] for n in graph.inputs})
        else:
            if graph.symbols:
                graph = self._for_shapes(graph, {n: values[n].shape for n in graph.inputs}, value_key)
            flat = interpret(graph, {n: values[n] for n in graph.inputs})
        layout = program.metadata.get(OUTPUT_LAYOUT_KEY)
        return tuple(group_outputs(flat, layout) if layout else flat)

    def _for_shapes(self, template: Any, shapes: dict[str, tuple[int, ...]], value_key: Any = ()) -> Any:
        """The template specialised to these input shapes (bound, substituted, verified; cached per binding
        and, for a value template, per value of its value-deciding inputs)."""
        from edgerun.ir.specialize import bind_symbols, specialize
        from edgerun.ir.verifier import verify

        bindings = bind_symbols(template, shapes)
        key = (value_key, tuple(sorted(bindings.items())))
        if key not in self._specialised:
            graph = specialize(template, bindings)
            verify(graph)  # every spec the template computed must agree with the op rules at these sizes
            self._specialised[key] = graph
        return self._specialised[key]


class EdgerunBackend(Backend):
    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        return device == "CPU"

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", symbolic_dims: bool = False,
                **kwargs: Any) -> EdgerunBackendRep:
        shapes = None
        if symbolic_dims:
            model, shapes = symbolic_input_model(model)
        if _structured_inputs(model):  # the structure comes with the values (sequence lengths, element shapes)
            return EdgerunBackendRep(model, None, shapes)
        # The conformance runner checks the importer's own graph; the passes have their own tests.
        return EdgerunBackendRep(model, from_onnx(model, optimize=False, input_shapes=shapes))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


prepare = EdgerunBackend.prepare
run_model = EdgerunBackend.run_model
supports_device = EdgerunBackend.supports_device
