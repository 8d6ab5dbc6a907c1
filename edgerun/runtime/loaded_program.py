"""LoadedProgram: a program made runnable at one set of shapes: one arena, one instruction list."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edgerun.backends.base import Backend, CompiledPartition, PartitionRun
from edgerun.errors import EdgerunError
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import bind_inputs
from edgerun.runtime.executor import Executor
from edgerun.runtime.instructions import EventSink, Instruction
from edgerun.runtime.memory_plan import ArenaPlan
from edgerun.runtime.methods import RunnableProgram
from edgerun.runtime.partition import Partition
from edgerun.runtime.state import StateBinding

if TYPE_CHECKING:
    from edgerun.program import Program

_NEVER = np.dtype([("string input: always checked", "V1")])


@dataclass(frozen=True)
class LoadedParts:
    """Everything load() produced, kept for the tools (`edgerun plan`, `edgerun info`, the profiler)."""

    graph: Graph  # as executed: composites decomposed
    partitions: list[Partition]
    compiled: list[CompiledPartition]
    plan: ArenaPlan
    arena: np.ndarray  # the one uint8 buffer every planned value lives in
    views: dict[str, np.ndarray]  # value name -> array (arena views, constants, views of constants)
    instructions: list[Instruction]
    program: Program | None
    backends: dict[str, Backend]  # every backend placement could use, by name
    output_names: list[str]  # the program's names for its outputs (decomposition may rename values)
    state: StateBinding | None = None  # the method's link to the program's state buffers (runtime/state.py)


class LoadedProgram(RunnableProgram):
    """A RunnableProgram (runtime/methods.py) at one set of shapes.

    Returned arrays are fresh copies (the arena is reused by the next call). Inputs are checked against the
    program's specs; a dtype that converts safely (same kind, e.g. float64 to float32) is converted. Calls
    are serialised by a lock: one arena, one call at a time; load twice to run in parallel. The methods of
    one load share one lock.
    """

    def __init__(self, parts: LoadedParts) -> None:
        self.parts = parts
        self.graph = parts.graph
        self.program = parts.program
        self.plan = parts.plan
        self._executor = Executor(parts.instructions)
        self._input_views = [parts.views[n] for n in self.graph.inputs]
        self._output_views = [parts.views[n] for n in self.graph.outputs]
        # (shape, dtype) per input, for the fast path: arrays that match exactly skip bind_inputs. A string
        # input's is a dtype no array has, so it always takes bind_inputs, which checks that its elements are str.
        self._input_types = tuple((self.graph.specs[n].shape, _NEVER if self.graph.specs[n].dtype is DType.string
                                   else self.graph.specs[n].dtype.np) for n in self.graph.inputs)
        # The fast path's table: (arena view, shape, dtype) per input, and the unprofiled run.
        self._input_slots = tuple((view, shape, dtype) for view, (shape, dtype)
                                  in zip(self._input_views, self._input_types))
        self._execute = self._executor.unprofiled()
        self._direct = _direct_partition(parts)
        self._output_types = tuple((self.graph.specs[n].shape, self.graph.specs[n].dtype.np)
                                   for n in self.graph.outputs)
        self._state = parts.state
        self._lock = parts.state.store.lock if parts.state is not None else threading.Lock()

    # -- description -------------------------------------------------------------------------------------
    @property
    def output_names(self) -> list[str]:
        return list(self.parts.output_names)

    @property
    def output_specs(self) -> dict[str, TensorSpec]:
        return {n: self.graph.specs[v] for n, v in zip(self.parts.output_names, self.graph.outputs)}

    @property
    def instructions(self) -> list[Instruction]:
        return self.parts.instructions

    @property
    def partitions(self) -> list[Partition]:
        return self.parts.partitions

    @property
    def arena_bytes(self) -> int:
        return self.plan.arena_bytes

    @property
    def busy_after_call_s(self) -> float:
        """How long the threads of the backends this program runs on stay busy after a call (each backend's
        declaration): what a measurement of another program waits out first."""
        backends = self.parts.backends
        return max((backends[p.backend].busy_after_call_s for p in self.partitions if p.backend in backends),
                   default=0.0)

    def __repr__(self) -> str:
        backends = sorted({p.backend for p in self.partitions})
        return (f"<LoadedProgram {len(self.graph.inputs)} inputs, {len(self.graph.outputs)} outputs, "
                f"{len(self.instructions)} instructions on {', '.join(backends) or 'nothing'}, "
                f"arena {self.plan.arena_bytes} B>")

    def release_own(self) -> None:
        """Each partition's `release` (ONNX Runtime's session, MNN's interpreter), then the arena and the
        instructions bound to it; a call after this raises EdgerunError."""
        for compiled in self.parts.compiled:
            compiled.release()
        self.parts = dataclasses.replace(self.parts, instructions=[], views={}, arena=np.empty(0, np.uint8))
        self._executor = Executor([])
        self._input_views = self._output_views = []
        self._input_slots = ()
        self._direct = None
        self.run = _released  # type: ignore[method-assign]

    # -- running -----------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
            sink: EventSink | None = None) -> list[np.ndarray]:
        """Outputs as a list, in output order; `sink` receives one event per instruction."""
        if sink is None and self._state is None and (type(inputs) is list or type(inputs) is tuple) \
                and len(inputs) == len(self._input_slots):
            # One partition that copies at its boundary: no arena copies.
            if self._direct is not None and self._exact_inputs(inputs) is not None:
                outputs = [np.empty(shape, dtype) for shape, dtype in self._output_types]
                with self._lock:
                    self._direct(inputs, outputs)
                return outputs
            # The common call, checked and copied in one pass under the lock: ndarrays of exactly the input
            # shapes and dtypes. It saves 2-3 us of a tiny model's call (MLP on ORT: 35 -> 33 us, of which
            # ORT's own run is 28). Anything else leaves the loop and takes the full path below, which
            # copies every input again.
            with self._lock:
                for value, (view, shape, dtype) in zip(inputs, self._input_slots):
                    if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
                        break
                    view[...] = value
                else:
                    self._execute()
                    return [v.copy() for v in self._output_views]
        values = self._exact_inputs(inputs)
        if values is None:  # anything else takes the full check, with its errors and safe conversions
            if isinstance(inputs, Mapping):
                extra = sorted(set(inputs) - set(self.graph.inputs))
                if extra:
                    raise EdgerunError(f"unknown inputs {extra}; the program takes {self.graph.inputs}")
            bound = bind_inputs(self.graph, inputs)
            values = [bound[name] for name in self.graph.inputs]
        with self._lock:
            for view, value in zip(self._input_views, values):
                view[...] = value
            if self._state is not None:  # a state another partition keeps comes back to the host first
                self._state.before_call()
            self._executor.run(sink)
            outputs = [v.copy() for v in self._output_views]
            if self._state is not None:  # after the copies: an output may be a view of a state's old value
                self._state.write_back()
            return outputs

    def _exact_inputs(self, inputs: object) -> Sequence[np.ndarray] | None:
        """`inputs` when it is a tuple or list of ndarrays of exactly the input shapes and dtypes (the common
        call, checked in well under a microsecond); None sends the call through bind_inputs."""
        if (type(inputs) is not tuple and type(inputs) is not list) or len(inputs) != len(self._input_types):
            return None
        for value, (shape, dtype) in zip(inputs, self._input_types):
            if type(value) is not np.ndarray or value.shape != shape or value.dtype != dtype:
                return None
        return inputs

    def value(self, name: str) -> np.ndarray:
        """The array holding value `name` (a view: valid during the step that wrote it; copy to keep it).

        Values inside a delegated partition are the backend's own and have no array here.
        """
        try:
            return self.parts.views[name]
        except KeyError:
            raise EdgerunError(f"value {name!r} has no array in this loaded program") from None


def _released(*args: object, **kwargs: object) -> list[np.ndarray]:
    raise EdgerunError("this program was released (RunnableProgram.release): load it again to run it")


def _direct_partition(parts: LoadedParts) -> PartitionRun | None:
    """The `run` of a program that is one partition of a backend that copies at its boundary
    (Backend.copies_at_boundary: it copies in and out of memory of its own and keeps no array it is handed)
    whose inputs are the program's (in any order) and whose outputs are the program's, in order:
    LoadedProgram.run calls it on the caller's inputs and fresh outputs. None for anything else (the arena
    path)."""
    if parts.state is not None or len(parts.instructions) != 1 or parts.instructions[0].op != "partition":
        return None
    index = parts.instructions[0].partition
    compiled = next(cp for p, cp in zip(parts.partitions, parts.compiled) if p.index == index)
    backend = parts.backends.get(compiled.backend)
    inputs, outputs = list(parts.graph.inputs), list(parts.graph.outputs)
    if backend is None or not backend.copies_at_boundary or not set(compiled.graph.inputs) <= set(inputs) \
            or list(compiled.graph.outputs) != outputs or len(set(outputs)) != len(outputs) \
            or set(outputs) & set(inputs):
        return None
    if list(compiled.graph.inputs) == inputs:
        return compiled.run
    order = [inputs.index(v) for v in compiled.graph.inputs]  # the partition lists its inputs by first use
    run = compiled.run
    return lambda values, results: run([values[k] for k in order], results)
