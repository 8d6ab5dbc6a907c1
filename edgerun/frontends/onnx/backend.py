"""edgerun as an `onnx.backend.base.Backend`, so ONNX's own test runner and node cases can drive it.

ONNX models often feed shape-like values (Reshape's target, Slice's starts, reduction axes) as graph
inputs. edgerun programs have static shapes, so such a model is specialised at run time: the inputs a
handler needs statically are frozen to the values given to `run` and the model is imported for them
(cached per value). Which inputs were frozen is reported in `rep.frozen`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx.backend.base import Backend, BackendRep

from edgerun.frontends.onnx import from_onnx
from edgerun.frontends.onnx.context import DynamicInputError
from edgerun.oracle import interpret


def _input_names(model: Any) -> list[str]:
    inits = {t.name for t in model.graph.initializer}
    return [vi.name for vi in model.graph.input if vi.name not in inits]


class EdgerunBackendRep(BackendRep):
    """An imported program (or, for shape-input models, the recipe to import one per input value)."""

    def __init__(self, model: Any, program: Any = None, frozen: tuple[str, ...] = ()) -> None:
        self.model = model
        self.program = program
        self.frozen: tuple[str, ...] = frozen
        self._cache: dict[bytes, Any] = {}

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        names = _input_names(self.model)
        if isinstance(inputs, dict):
            values = {k: np.asarray(v) for k, v in inputs.items()}
        else:
            seq = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            values = {n: np.asarray(v) for n, v in zip(names, seq)}
        program = self.program if self.program is not None else self._specialise(values)
        return tuple(interpret(program.graph, {n: values[n] for n in program.graph.inputs}))

    def _specialise(self, values: dict[str, np.ndarray]) -> Any:
        frozen = list(self.frozen)
        while True:
            key = b"".join(n.encode() + values[n].tobytes() + str(values[n].shape).encode() for n in frozen)
            if key in self._cache:
                return self._cache[key]
            try:
                # The conformance runner checks the importer's own graph; the passes have their own tests.
                program = from_onnx(self.model, constant_inputs={n: values[n] for n in frozen}, optimize=False)
            except DynamicInputError as exc:
                if exc.value_name in values and exc.value_name not in frozen:
                    frozen.append(exc.value_name)
                else:
                    # Computed from inputs: freeze the shape-like ones (integer scalars and vectors). Folding
                    # still runs our own handlers and kernels, so nothing is evaluated outside edgerun.
                    more = [n for n, v in values.items() if n not in frozen and v.dtype.kind in "iu" and v.ndim <= 1]
                    if not more:
                        raise
                    frozen.extend(more)
                self.frozen = tuple(frozen)
                continue
            self._cache[key] = program
            return program


class EdgerunBackend(Backend):
    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        return device == "CPU"

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> EdgerunBackendRep:
        try:
            return EdgerunBackendRep(model, from_onnx(model, optimize=False))
        except DynamicInputError as exc:
            first = (exc.value_name,) if exc.value_name in _input_names(model) else ()
            return EdgerunBackendRep(model, None, first)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[np.ndarray, ...]:
        return cls.prepare(model, device).run(inputs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device == "CPU"


prepare = EdgerunBackend.prepare
run_model = EdgerunBackend.run_model
supports_device = EdgerunBackend.supports_device
