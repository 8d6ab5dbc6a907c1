"""The state step of loading one method: everything `load_prepared` does about program state, in one place.

A graph with state is loaded functional (ir/state.py: each state read an input, each update an output), and
meets the state store at three points of the load, each a method here; for a graph without state each is a
no-op, so the other steps never ask whether there is state:

- `narrow` (after scheduling): a raster writing a few rows of a state (a KV cache's new entries) stops
  reading the old state (state.narrow_state_rasters), so its update can be planned in place;
- `plan` (after value lifetimes): the state's values leave the arena plan (state.plan_state): reads are
  views of the state's buffers, updates written in place where they can be, copied after the call
  otherwise; a narrowed raster whose update did not go in place gets its full regions back;
- `bind` (after the arena's views): the views of the state's buffers, the states a backend keeps in its
  own memory (state.keep_resident), the StateBinding the loaded method runs with, and the graph back in
  its stateful form.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgerun.backends.base import CompiledPartition
from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph
from edgerun.ir.state import StateSignature, from_functional, has_state, to_functional
from edgerun.runtime.memory_plan import TensorLifetime
from edgerun.runtime.schedule import Step
from edgerun.runtime.state import (
    StateBinding,
    StatePlan,
    StateStore,
    keep_resident,
    narrow_state_rasters,
    overwriting_steps,
    plan_state,
    state_views,
)


class MethodState:
    """One method's state while it loads (None-like when its graph holds no state)."""

    def __init__(self, graph: Graph, store: StateStore | None) -> None:
        self.signature: StateSignature | None = None
        self.store = store
        self.graph = graph  # functional from here on, until bind
        if has_state(graph):
            if store is None:
                raise EdgerunError("this graph reads or writes program state: load the Program that holds the "
                                   "state's initial values (edgerun.load(program)), not its graph alone")
            self.graph, self.signature = to_functional(graph)
        self._narrowed: dict[int, Step] = {}
        self._plan: StatePlan | None = None

    def narrow(self, steps: list[Step]) -> None:
        if self.signature is not None:
            self._narrowed = narrow_state_rasters(steps, self.graph, self.signature)

    def plan(self, steps: list[Step], lifetimes: dict[str, TensorLifetime], arena_aliases: dict[str, str],
             compiled: Sequence[CompiledPartition]) -> None:
        if self.signature is None:
            return
        overwrites = overwriting_steps(steps, lambda k: compiled[k].overwrites_inputs)
        self._plan = plan_state(self.graph, self.signature, lifetimes, arena_aliases, overwrites)
        for k, original in self._narrowed.items():  # its update was not placed in place: full regions again
            if not any(v in self._plan.views for v in original.writes):
                steps[k] = original

    def bind(self, views: dict[str, np.ndarray], steps: Sequence[Step],
             compiled: Sequence[CompiledPartition]) -> tuple[Graph, StateBinding | None]:
        """The graph in its stateful form and the method's binding; `views` gains the state views."""
        if self.signature is None or self._plan is None or self.store is None:
            return self.graph, None
        views.update(state_views(self.store, self._plan))
        resident = keep_resident(self.graph, self.signature, self._plan, steps, compiled, self.store)
        binding = StateBinding(self.store, self._plan, views, resident)
        return from_functional(self.graph, self.signature), binding


