"""Program state at run time: persistent buffers outside any arena, bound into each loaded method.

A `StateStore` holds one buffer per state, allocated once when the program is loaded and owned by the loaded
program's handle; every method (and every shape specialisation of a method) binds the same buffers, so
state written by one call is read by the next, whichever method it calls. The store's lock serialises
calls of all those methods: they share the buffers.

Loading a method plans its state (`plan_state`): the graph is functional by then (ir/state.py), so each
state read is a graph input and each update a graph output. A state read is not copied in: its value is
bound as a view of the state's buffer (and so are no-op reshapes of it), outside the arena. An update is
written into its buffer once, after the call's outputs are copied out (`StateBinding.write_back`), or, when
the update is first written after the last read of the old value, planned straight into the state's
buffer: the kernels write it in place and there is nothing to copy.

A state that one partition alone reads and updates may stay in that backend's memory across calls
(`keep_resident`, `CompiledPartition.keep_state`): the store records who holds the newest value
(`holders`) and copies it into its buffer only when the host needs it (`views`, `snapshot`, another
partition acquiring it); `reset` and `assign` overwrite the buffer and drop the holder.
"""

from __future__ import annotations

import mmap
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgerun.backends.base import CompiledPartition, ResidentState
from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph, Node
from edgerun.ir.region import Region, regions_of
from edgerun.ir.state import StateSignature
from edgerun.runtime.memory_plan import TensorLifetime, allocate_arena
from edgerun.runtime.schedule import Step, is_noop_raster


class StateStore:
    """The program's persistent tensors by name, each in its own aligned buffer, initialised from the
    program's initial values (which stay untouched, memory-mapped, for reset)."""

    def __init__(self, initial: Mapping[str, np.ndarray]) -> None:
        self.initial = {name: np.asarray(value) for name, value in initial.items()}
        # A state whose initial value is one zero broadcast (an LLM's KV cache) gets fresh anonymous pages,
        # which read as zeros and become resident only where a call writes: a cache of 512 positions costs
        # what the positions used so far fill, not its whole size from load on.
        self.zero_maps = {name: _zero_pages(value) for name, value in self.initial.items() if _is_zero_broadcast(value)}
        self.buffers = {name: (np.frombuffer(self.zero_maps[name], np.uint8) if name in self.zero_maps
                               else allocate_arena(value.nbytes)).view(value.dtype).reshape(value.shape)
                        for name, value in self.initial.items()}
        self.lock = threading.Lock()
        # state -> (the partition runner holding its newest value in its own memory, how to copy it here)
        self.holders: dict[str, tuple[object, Callable[[np.ndarray], None]]] = {}
        self.reset()

    def reset(self) -> None:
        """Every state back to its initial value."""
        with self.lock:
            self.holders.clear()  # a holder's copy is stale now: its next call loads the buffer
            for name, buffer in self.buffers.items():
                if name in self.zero_maps and sys.platform.startswith("linux"):
                    self.zero_maps[name].madvise(mmap.MADV_DONTNEED)  # private anonymous pages: zeros again, not resident
                else:
                    buffer[...] = self.initial[name]

    def materialise(self) -> None:
        """Copy every state a backend holds back into its buffer (the host's copy is current again)."""
        for name, (_, pull) in list(self.holders.items()):
            pull(self.buffers[name])
            del self.holders[name]

    def views(self) -> dict[str, np.ndarray]:
        """Read-only views of the buffers (they change with the next call: copy to keep a value; a state a
        backend keeps in its own memory shows the value it had when `views` was called)."""
        with self.lock:
            self.materialise()
        views = {}
        for name, buffer in self.buffers.items():
            view = buffer.view()
            view.flags.writeable = False
            views[name] = view
        return views

    def snapshot(self) -> dict[str, np.ndarray]:
        """A copy of every state's current value (`assign` puts it back)."""
        with self.lock:
            self.materialise()
            return {name: buffer.copy() for name, buffer in self.buffers.items()}

    def assign(self, values: Mapping[str, np.ndarray]) -> None:
        """Overwrite some states (same shape; a dtype that casts safely is converted)."""
        unknown = sorted(set(values) - set(self.buffers))
        if unknown:
            raise EdgerunError(f"unknown state {unknown}; the program's state is {sorted(self.buffers)}")
        with self.lock:
            for name, value in values.items():
                buffer, array = self.buffers[name], np.asarray(value)
                if array.shape != buffer.shape or not np.can_cast(array.dtype, buffer.dtype, "same_kind"):
                    raise EdgerunError(f"state {name!r} is {buffer.dtype}{list(buffer.shape)}, got "
                                       f"{array.dtype}{list(array.shape)}")
                self.holders.pop(name, None)
                buffer[...] = array


def _is_zero_broadcast(value: np.ndarray) -> bool:
    """Whether `value` is one zero element broadcast to its shape (a zero-initialised state's initial value)."""
    return hasattr(mmap, "MAP_PRIVATE") and value.size > 0 and not any(value.strides) and not value.flat[0]


def _zero_pages(value: np.ndarray) -> mmap.mmap:
    """Anonymous, page-aligned memory for `value`'s bytes, zero until written."""
    return mmap.mmap(-1, value.nbytes, flags=mmap.MAP_PRIVATE)  # private: MADV_DONTNEED zeroes it (reset)


@dataclass(frozen=True)
class StatePlan:
    """How one loaded method meets the state: which values are views of a state buffer (the reads, their
    no-op reshapes, and updates planned in place) and which updates are copied in after the call."""

    views: dict[str, tuple[str, tuple[int, ...]]]  # value -> (state whose buffer it views, its shape)
    copies: tuple[tuple[str, str], ...]  # (state, value) written into the state's buffer after a call
    in_place: tuple[str, ...]  # states whose update the kernels write straight into the state's buffer


def overwriting_steps(steps: list[Step], overwrites_of: Callable[[int], Mapping[str, str]],
                      ) -> dict[str, tuple[str, ...]]:
    """Value -> the inputs of the step making it, first the one whose buffer it may be written over: each
    output its partition declares it computes over one of the step's inputs (`overwrites_of(partition)`,
    CompiledPartition.overwrites_inputs: a delegate's whole-partition step, or a bound node such as the
    reference's update_slice). An update of a state made so reads the old state in the same step, and
    plan_state may put it in that state's buffer."""
    found: dict[str, tuple[str, ...]] = {}
    for step in steps:
        for value, read in overwrites_of(step.partition).items():
            if value in step.writes and read in step.reads:
                others = list(step.reads)
                others.remove(read)
                found[value] = (read, *others)
    return found


def plan_state(graph: Graph, signature: StateSignature, lifetimes: dict[str, TensorLifetime],
               arena_aliases: dict[str, str], overwrites: Mapping[str, tuple[str, ...]] | None = None,
               ) -> StatePlan:
    """Take the state's values out of the arena plan (mutating `lifetimes` and `arena_aliases`).

    `overwrites` (overwriting_steps) names the values whose kernel may write over its first input: one that
    updates the state it reads as that input, and reads no other view of it, is placed in place although
    it is written in the step of the state's last read."""
    reads = set(signature.reads)
    views: dict[str, tuple[str, tuple[int, ...]]] = {s: (s, graph.specs[s].shape) for s in reads}
    for value, root in list(arena_aliases.items()):
        if root in reads:  # a reshape of a state read: a reshaped view of the state's buffer
            views[value] = (root, graph.specs[value].shape)
            del arena_aliases[value]
    last_read = {s: max([lifetimes[v].last for v, (root, _) in views.items() if root == s and v in lifetimes],
                        default=0) for s in reads}
    update_values = [graph.outputs[index] for _, index in signature.updates]
    copies, in_place_states = [], []
    for state, index in signature.updates:
        value = graph.outputs[index]
        inputs = (overwrites or {}).get(value, ())
        over_own_read = bool(inputs) and inputs[0] == state and not any(
            views.get(i, ("", ()))[0] == state for i in inputs[1:])
        in_place = (value in lifetimes and value not in views and value not in arena_aliases
                    and update_values.count(value) == 1
                    and (lifetimes[value].first > last_read.get(state, 0)
                         or (over_own_read and lifetimes[value].first == last_read.get(state, 0))))
        if in_place:
            views[value] = (state, graph.specs[value].shape)
            for alias, root in list(arena_aliases.items()):
                if root == value:  # a reshape of the new value: a view of the state's buffer too
                    views[alias] = (state, graph.specs[alias].shape)
                    del arena_aliases[alias]
            in_place_states.append(state)
        else:
            copies.append((state, value))
    for value in views:
        lifetimes.pop(value, None)
    return StatePlan(views, tuple(copies), tuple(in_place_states))


class StateBinding:
    """A loaded method's link to the store: its state views, and the copies that end each call."""

    def __init__(self, store: StateStore, plan: StatePlan, views: Mapping[str, np.ndarray],
                 resident: Sequence[str] = ()) -> None:
        self.store = store
        self.plan = plan
        self.resident = tuple(resident)  # states a backend keeps (keep_resident): nothing to copy for them
        # An update whose value is itself a view of some state's buffer (one state takes another's old
        # value) is snapshotted before any buffer is written.
        self._copies = tuple((store.buffers[s], views[v], v in plan.views) for s, v in plan.copies
                             if s not in self.resident)
        # States this method reads or writes through the host buffers: a backend holding one hands it back
        # before the call.
        self._on_host = tuple(sorted(({s for s, _ in plan.views.values()} | {s for s, _ in plan.copies})
                                     - set(self.resident)))

    def before_call(self) -> None:
        holders = self.store.holders
        if holders:
            for state in self._on_host:
                held = holders.pop(state, None)
                if held is not None:
                    held[1](self.store.buffers[state])

    def write_back(self) -> None:
        pending = [(dst, src.copy() if snapshot else src) for dst, src, snapshot in self._copies]
        for dst, src in pending:
            dst[...] = src


def keep_resident(graph: Graph, signature: StateSignature, plan: StatePlan, steps: Sequence[Step],
                  compiled: Sequence[CompiledPartition], store: StateStore) -> tuple[str, ...]:
    """Offer each state that a single whole-partition step alone reads and updates (no other step touches
    the state's read, its views or its update, and the method returns neither) to that partition's backend
    when it offers `keep_state`; returns the states it keeps. `graph` is the functional graph."""
    touching: dict[str, set[int]] = {}
    for k, step in enumerate(steps):
        for v in (*step.reads, *step.writes):
            touching.setdefault(v, set()).add(k)
    offers: dict[int, list[ResidentState]] = {}
    for state, index in signature.updates:
        update = graph.outputs[index]
        related = {v for v, (root, _) in plan.views.items() if root == state} | {state, update}
        steps_touching = set().union(*(touching.get(v, set()) for v in related))
        if state not in signature.reads or len(steps_touching) != 1:
            continue
        step = steps[steps_touching.pop()]
        part = compiled[step.partition]
        if (step.node is not None or part.keep_state is None or state not in part.graph.inputs
                or update not in part.graph.outputs or graph.outputs.count(update) != 1
                or any(v in graph.outputs for v in related - {update})):
            continue
        offers.setdefault(step.partition, []).append(
            ResidentState(state, state, update, store.buffers[state], store.holders))
    kept: list[str] = []
    for index, handles in offers.items():
        keep = compiled[index].keep_state
        assert keep is not None
        kept += [h.name for h in handles if h.name in set(keep(handles))]
    return tuple(kept)


def state_views(store: StateStore, plan: StatePlan) -> dict[str, np.ndarray]:
    """Each state-bound value's array: a (reshaped) view of its state's buffer."""
    missing = sorted({s for s, _ in plan.views.values()} - set(store.buffers))
    if missing:
        raise EdgerunError(f"the method uses state {missing}, which this program's state store does not hold")
    return {value: store.buffers[state].reshape(shape) for value, (state, shape) in plan.views.items()}


def narrow_state_rasters(steps: list[Step], graph: Graph, signature: StateSignature) -> dict[int, Step]:
    """Let a raster that writes a few rows of a state (a KV cache's new entries) update it in place.

    A raster whose output is a state's update and whose regions copy the old state to the same places
    (torch's slice_scatter: before, new rows, after) needs only the new rows written when its output is
    the state's buffer. When the old state has no other reader, no fill is set, the step is a bound node
    (a bound raster writes only its regions' bytes: base.NodeBinder), and no later region writes over an
    earlier new one, the step is replaced (in `steps`, in place) by one that no longer reads the state; the state's read
    then ends before its update, so plan_state puts the update in the state's buffer. Returns the
    replaced steps by index: the caller puts back any whose update plan_state did not place in place.
    """
    readers: dict[str, list[int]] = {}
    for k, step in enumerate(steps):
        for value in step.reads:
            readers.setdefault(value, []).append(k)
    update_values = [graph.outputs[index] for _, index in signature.updates]
    originals: dict[int, Step] = {}
    for state, index in signature.updates:
        value = graph.outputs[index]
        users = readers.get(state, [])
        if len(users) != 1 or state in graph.outputs or update_values.count(value) != 1:
            continue
        k = users[0]
        step = steps[k]
        node = step.node
        if node is None or node.op != "raster" or value not in node.outputs or node.attrs.get("fill") is not None:
            continue
        narrowed = _without_state_regions(node, state)
        if narrowed is not None and not is_noop_raster(narrowed, graph):
            originals[k] = step
            steps[k] = Step(tuple(i for i in narrowed.inputs if i), step.writes, step.partition, narrowed)
    return originals


def _without_state_regions(node: Node, state: str) -> Node | None:
    """The raster without its copies of `state` onto the same places, or None when it cannot drop them."""
    sources = [i for i, name in enumerate(node.inputs) if name == state]
    regions = regions_of(node.attrs)
    kept: list[Region] = []
    for r in regions:
        if r.src not in sources:
            kept.append(r)
            continue
        if (r.src_offset, r.src_strides) != (r.dst_offset, r.dst_strides):
            return None  # the old state moves: it must be read before its buffer is written
        lo, hi = r.extent("dst") if r.numel else (0, -1)
        if any(k.numel and k.extent("dst")[0] <= hi and lo <= k.extent("dst")[1] for k in kept):
            return None  # it would overwrite an earlier region's bytes
    if not kept or len(kept) == len(regions):
        return None
    inputs = [name for i, name in enumerate(node.inputs) if i not in sources]
    index = {old: new for new, old in enumerate(i for i in range(len(node.inputs)) if i not in sources)}
    attrs = dict(node.attrs)
    attrs["regions"] = [Region(index[r.src], r.src_offset, r.src_strides, r.dst_offset, r.dst_strides,
                               r.size).to_list() for r in kept]
    return Node(node.op, inputs, list(node.outputs), attrs, dict(node.meta), node.name)
