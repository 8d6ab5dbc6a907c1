"""SpecializingProgram: a template program (symbolic dimensions) run by specialising it per concrete shape.

It is a RunnableProgram (runtime/methods.py) that holds loaded programs, one per shape, rather than being
one: what belongs to a single plan (`plan`, `parts`, `instructions`) is a specialisation's
(`model.specialization(...)`).

This is MNN's resize: the first call at a new shape binds the symbols from the input shapes (bounds and
consistency checked, ir/specialize.py), substitutes them, runs the export pipeline (`passes.optimize`:
decomposition, folding, raster merging) on the now static graph and loads it through the normal load path
(placement, partitioning, compilation, an exact memory plan for that shape). The loaded specialisation is
cached by its bindings in a bounded LRU, so steady-state calls at a known shape cost one dictionary lookup
more than a static program. Why per shape rather than one plan for the upper bound: docs/design.md.

A template may also specialise on the *values* of a few small inputs that decide its structure (ONNX's
reduction axes, Resize scales, a Reshape target: a ValueSpecializer, frontends/onnx/value_template.py). Its
values are folded in first, then the symbols of the result are bound from the other inputs' shapes; the LRU
key is (the values, the bindings), so a call with other values never reuses a specialisation.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.specialize import ValueKey, bind_symbols, specialize
from edgerun.ir.staging import has_data_dependent
from edgerun.ir.state import on_functional
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.passes.pipeline import METADATA_KEY, optimize, records_to_json
from edgerun.program import Program
from edgerun.runtime.instructions import EventSink
from edgerun.runtime.methods import RunnableProgram
from edgerun.runtime.staged import StagedRun

if TYPE_CHECKING:
    from edgerun.ir.graph import Graph

DEFAULT_CACHE_SIZE = 8  # loaded specialisations kept; each holds its own arena and compiled partitions
Bindings = tuple[tuple[str, int], ...]  # sorted (symbol, value) pairs
CacheKey = tuple[ValueKey, Bindings]  # value-deciding inputs' values (empty for most programs), then symbols
_MAX_REMEMBERED_SHAPES = 1024  # input-shape tuples whose binding is remembered (a dict, cleared when full)


@runtime_checkable
class ValueSpecializer(Protocol):
    """A template whose structure depends on the values of some small inputs (frontends/onnx/value_template.py):
    `for_values` gives the program for a call's values (folded in, so not among its inputs) and their key."""

    value_inputs: list[str]
    output_names: list[str]

    def for_values(self, inputs: Mapping[str, Any]) -> tuple[Program, ValueKey]: ...


def specialize_program(template: Program, bindings: Mapping[str, int]) -> Program:
    """The static Program for `bindings`: substituted, then optimised by the default export pipeline."""
    records = []

    def run_pipeline(graph: Graph) -> Graph:
        optimized, found = optimize(graph)
        records.extend(found)
        return optimized

    graph = on_functional(specialize(template.graph, bindings), run_pipeline)  # state: ir/state.py
    metadata = dict(template.metadata)
    metadata[METADATA_KEY] = records_to_json(records)
    metadata["specialized_from"] = {"symbols": dict(sorted(bindings.items()))}
    return Program(graph, metadata)


class SpecializingProgram(RunnableProgram):
    """What `edgerun.load` returns for a template: called like any loaded program (`m(x)`, `m.run(...)`).

    `input_specs` shows the symbols (`float32[batch,seq,32]`), `symbols` their bounds. Per-shape details
    (plan, arena, instructions) belong to one specialisation: `specialization(x=...)` returns it.
    """

    def __init__(self, template: Program, load_concrete: Callable[[Program], RunnableProgram],
                 cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 1:
            raise EdgerunError(f"cache_size must be at least 1, got {cache_size}")
        self.program = self._template = template
        self.graph: Graph = template.graph
        self._load_concrete = load_concrete
        self._cache: OrderedDict[CacheKey, RunnableProgram] = OrderedDict()
        self._values = template if isinstance(template, ValueSpecializer) else None
        self._cache_size = cache_size
        self._cache_lock = threading.Lock()
        self._released = False
        self._bound_shapes: dict[tuple[tuple[int, ...], ...], Bindings] = {}  # input shapes -> their binding
        self.specializations_made = 0  # loads done, evictions included (first-call cost is paid this often)
        # A template holding data-dependent ops (nonzero, ...) runs in stages, each stage a template of its own.
        self._stages = StagedRun(template, self._load_stage) if self._values is None and has_data_dependent(
            template.graph) else None

    def _load_stage(self, stage: Program) -> RunnableProgram:
        if stage.graph.symbols:
            return SpecializingProgram(stage, self._load_concrete, self._cache_size)
        return self._load_concrete(stage)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)  # another method of a multi-method program
        except AttributeError:
            raise AttributeError(f"this template program (symbols {sorted(self.graph.symbols)}) has no attribute "
                                 f"{name!r}: what belongs to one shape (plan, parts, instructions) is "
                                 "model.specialization(...)'s, for inputs of that shape") from None

    # -- description -------------------------------------------------------------------------------------
    @property
    def symbols(self) -> dict[str, tuple[int, int]]:
        return dict(self.graph.symbols)

    @property
    def output_names(self) -> list[str]:
        return list(self._values.output_names if self._values is not None else self.graph.outputs)

    @property
    def output_specs(self) -> dict[str, TensorSpec]:
        if self._values is not None:
            raise EdgerunError(f"the outputs' specs depend on the values of inputs {self._values.value_inputs}: "
                               "see model.specialization(inputs).output_specs")
        return {n: self.graph.specs[n] for n in self.graph.outputs}

    @property
    def value_inputs(self) -> list[str]:
        """Inputs whose values (not only shapes) pick the specialisation; empty for most programs."""
        return list(self._values.value_inputs) if self._values is not None else []

    @property
    def cached_bindings(self) -> list[dict[str, int]]:
        """The symbol bindings loaded now, least recently used first."""
        with self._cache_lock:
            return [dict(bindings) for _, bindings in self._cache]

    def __repr__(self) -> str:
        symbols = ", ".join(f"{k} in [{lo}, {hi}]" for k, (lo, hi) in sorted(self.graph.symbols.items()))
        values = f", values of {self.value_inputs}" if self._values is not None else ""
        return (f"<SpecializingProgram {len(self.graph.inputs)} inputs, {len(self.output_names)} outputs, "
                f"symbols {symbols}{values}; {len(self._cache)} of {self._cache_size} specialisations loaded>")

    # -- running -----------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
            sink: EventSink | None = None) -> list[np.ndarray]:
        if self._stages is not None:
            return self._stages.run(self._named(inputs), sink)
        if self._values is None:
            shapes_only: CacheKey = ((), self._bindings(inputs, as_shapes=False))
            return self._specialization(shapes_only, self._template).run(inputs, sink)
        named = self._named(inputs)
        key, program = self._for_values(named)
        # The value-deciding inputs are folded into the specialisation: it takes the others.
        return self._specialization(key, program).run({n: named[n] for n in program.graph.inputs}, sink)

    def specialization(self, inputs: Sequence[Any] | Mapping[str, Any] | None = None,
                       **shapes: tuple[int, ...]) -> RunnableProgram:
        """The loaded program for these inputs' shapes (arrays), or for shapes given by name
        (`specialization(x=(2, 16, 32))`), loading it on first use. A template with value-deciding inputs
        needs the arrays (their values pick the specialisation)."""
        if self._values is not None:
            if inputs is None:
                raise EdgerunError(f"inputs {self._values.value_inputs} decide this program's structure by their "
                                   "values: pass the input arrays, not shapes")
            key, program = self._for_values(self._named(inputs))
            return self._specialization(key, program)
        bindings = self._bindings(shapes, as_shapes=True) if inputs is None else self._bindings(inputs, False)
        return self._specialization(((), bindings), self._template)

    def release_own(self) -> None:
        """Release every loaded specialisation; a call after this raises EdgerunError."""
        with self._cache_lock:
            loaded, self._released = list(self._cache.values()), True
            self._cache.clear()
        for program in loaded:
            program.release()

    def _specialization(self, key: CacheKey, template: Program) -> RunnableProgram:
        if self._released:
            raise EdgerunError("this program was released (RunnableProgram.release): load it again to run it")
        with self._cache_lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        # Loaded outside the lock: a slow first call at one shape does not hold up calls at cached ones.
        bindings = dict(key[1])
        if has_data_dependent(template.graph):  # a value's program with nonzero, ...: staged, per shape inside
            loaded: RunnableProgram = SpecializingProgram(template, self._load_concrete, self._cache_size)
        else:
            concrete = specialize_program(template, bindings) if template.graph.symbols else template
            loaded = self._load_concrete(concrete)
        with self._cache_lock:
            self.specializations_made += 1
            loaded = self._cache.setdefault(key, loaded)
            self._cache.move_to_end(key)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return loaded

    def _for_values(self, named: Mapping[str, Any]) -> tuple[CacheKey, Program]:
        """The program for a call's value-deciding inputs, and the cache key: their values, then the symbols
        of that program bound from the other inputs' shapes."""
        assert self._values is not None
        program, values = self._values.for_values(named)
        graph = program.graph
        bindings: Bindings = ()
        if graph.symbols and not has_data_dependent(graph):  # a staged program binds per stage
            shapes = {n: np.shape(named[n]) for n in graph.inputs}
            bindings = tuple(sorted(bind_symbols(graph, shapes).items()))
        return (values, bindings), program

    def _named(self, inputs: Sequence[Any] | Mapping[str, Any]) -> dict[str, Any]:
        names = self.graph.inputs
        if isinstance(inputs, Mapping):
            if set(inputs) != set(names):
                raise EdgerunError(f"inputs {sorted(inputs)} do not match the program's {names}")
            return {n: inputs[n] for n in names}
        if len(inputs) != len(names):
            raise EdgerunError(f"the program takes {len(names)} inputs {names}, got {len(inputs)}")
        return dict(zip(names, inputs))

    def _bindings(self, inputs: Sequence[Any] | Mapping[str, Any], as_shapes: bool) -> Bindings:
        names = self.graph.inputs
        named = self._named(inputs)
        shapes = tuple(tuple(named[n]) if as_shapes else np.shape(named[n]) for n in names)
        key = self._bound_shapes.get(shapes)
        if key is None:  # binding checks every dimension in Python: done once per distinct set of shapes
            key = tuple(sorted(bind_symbols(self.graph, dict(zip(names, shapes))).items()))
            if len(self._bound_shapes) >= _MAX_REMEMBERED_SHAPES:
                self._bound_shapes.clear()
            self._bound_shapes[shapes] = key
        return key
