"""What `edgerun.load` returns (RunnableProgram), and multi-method programs: one per method, sharing state.

Every loaded program is a RunnableProgram: a LoadedProgram (one plan: one arena, one instruction list) or a
SpecializingProgram (a template, holding one LoadedProgram per concrete shape: runtime/specializing.py).
`edgerun.load` on a program with several methods (or with state) loads each method's graph as its own
LoadedProgram (its own placement, arena and instructions; the weights are the same memory-mapped arrays)
and binds every one to a single StateStore. The default method's LoadedProgram is what load returns:

    model = edgerun.load("llm.edgerun")
    model.methods                     # ["forward", "decode", ...]: the default first
    model(ids)                        # the default method
    model.decode(token)               # any method by attribute, or model.run_method("decode", token)
    model.state                       # {name: read-only view of the state's buffer}
    model.reset_state()               # every state back to its initial value
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.runtime.state import StateStore

if TYPE_CHECKING:
    from edgerun.ir.graph import Graph
    from edgerun.ir.tensor_spec import TensorSpec
    from edgerun.program import Program
    from edgerun.runtime.instructions import EventSink

DEFAULT_METHOD = "forward"  # program_parts.DEFAULT_METHOD; the runtime does not import the codec


class RunnableProgram(ABC):
    """A loaded program: called like a function on numpy arrays, with its methods and its state.

    Call with positional arrays (`m(x, y)`) or by input name (`m(x=..., y=...)`): a program with one output
    returns that array, one with several a tuple of them, as calling a torch module does; `run` always
    returns a list. Every method of one load has the same table and store, so `model.decode.prefill` is
    `model.prefill`. A program with one method and no state has a table of itself and an empty state.
    """

    graph: Graph  # the default method's graph (a template's: with its symbols)
    program: Program | None = None
    # What chose the placement, when the load-time search did (edgerun.search.AutoPlan; shown by
    # `edgerun plan`). The runtime never reads it.
    search: object = None
    _method_table: dict[str, RunnableProgram] | None = None
    _state_store: StateStore | None = None
    method_name: str = DEFAULT_METHOD

    @abstractmethod
    def run(self, inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
            sink: EventSink | None = None) -> list[np.ndarray]:
        """Outputs as a list, in output order; `sink` receives one event per instruction."""

    def __call__(self, *arrays: np.ndarray, **named: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """Run the default method on inputs by position or by name."""
        if arrays and named:
            raise EdgerunError("pass inputs either by position or by name, not both")
        outs = self.run(named if named else arrays)
        return outs[0] if len(outs) == 1 else tuple(outs)

    @property
    def input_names(self) -> list[str]:
        return list(self.graph.inputs)

    @property
    def input_specs(self) -> dict[str, TensorSpec]:
        return {n: self.graph.specs[n] for n in self.graph.inputs}

    @property
    @abstractmethod
    def output_names(self) -> list[str]: ...

    @property
    @abstractmethod
    def output_specs(self) -> dict[str, TensorSpec]: ...

    @property
    def methods(self) -> list[str]:
        """Method names, the default first."""
        return list(self._method_table) if self._method_table else [self.method_name]

    def method(self, name: str) -> RunnableProgram:
        """The loaded program of method `name`."""
        table: dict[str, Any] = {self.method_name: self, **(self._method_table or {})}
        try:
            return table[name]  # type: ignore[no-any-return]
        except KeyError:
            raise EdgerunError(f"the program has no method {name!r}; its methods are {list(table)}") from None

    def release(self) -> None:
        """Free what the load made, every method's (backend sessions, converted models, arenas), now rather
        than when the last reference goes: the compile / run / release contract's last step
        (CompiledPartition.release). The program does not run after it: a call raises EdgerunError."""
        for program in {id(p): p for p in [self, *(self._method_table or {}).values()]}.values():
            program.release_own()

    @abstractmethod
    def release_own(self) -> None:
        """`release` for this method alone."""

    def join_methods(self, name: str, table: dict[str, RunnableProgram], store: StateStore,
                     program: Program) -> None:
        """Become method `name` of `program`'s load: one table of its methods, one store of its state."""
        self._method_table, self._state_store, self.method_name, self.program = table, store, name, program

    def run_method(self, name: str, *arrays: np.ndarray, **named: np.ndarray) -> Any:
        """Call method `name` as the program itself is called (one array, or a tuple of outputs)."""
        return self.method(name)(*arrays, **named)

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not attributes: a method by name (`model.decode(...)`).
        table = self.__dict__.get("_method_table")
        if not name.startswith("_") and table and name in table:
            return table[name]
        raise AttributeError(f"{type(self).__name__!r} has no attribute {name!r}"
                             + (f" (its methods are {list(table)})" if table else ""))

    # -- state -------------------------------------------------------------------------------------------
    @property
    def state(self) -> dict[str, np.ndarray]:
        """Each state's current value as a read-only view (the next call changes it: copy to keep it)."""
        return self._state_store.views() if self._state_store is not None else {}

    def reset_state(self) -> None:
        """Every state back to the initial value stored in the program."""
        if self._state_store is not None:
            self._state_store.reset()

    def set_state(self, **values: np.ndarray) -> None:
        """Overwrite states by name (e.g. restore a snapshot taken from `state`)."""
        if self._state_store is None:
            raise EdgerunError("this program has no state")
        self._state_store.assign(values)


def has_methods_or_state(program: Program) -> bool:
    return len(program.methods) > 1 or bool(program.state) or program.default_method != DEFAULT_METHOD


def load_methods(program: Program, load_one: Callable[..., RunnableProgram]) -> RunnableProgram:
    """Load every method with `load_one(graph, state=store)` against one new StateStore; returns the default.

    The store is reset once all are loaded: a load-time search may have run a method to time it.
    """
    program.check_state()
    store = StateStore(program.state)
    graphs: dict[str, Graph] = {program.default_method: program.graph}
    graphs.update((n, g) for n, g in program.methods.items() if n != program.default_method)
    table = {name: load_one(graph, state=store) for name, graph in graphs.items()}
    store.reset()
    for name, loaded in table.items():
        loaded.join_methods(name, table, store, program)
    return table[program.default_method]
