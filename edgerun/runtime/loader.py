"""load(): program file -> placement -> partitions -> compiled partitions -> memory plan -> instructions.

The sequence, each step in its own module:
1. read the program (weights memory-mapped, never copied), decompose the composites no candidate backend
   keeps whole, verify the graph;
2. place each node on a backend (placement.py, or a placer: placer.py), lower the composites placed where
   they are not kept, and cut the graph into partitions (partition.py);
3. compile each partition on its backend, falling back to reference with a warning if that fails, giving
   back the program file's pages the backends touch as they go (weights they keep in their own form,
   prepacked or converted, are then resident once; a page read again comes back from the file);
4. schedule: one step per node of arena-bound partitions, one per delegate partition (schedule.py);
5. elide no-op rasters (reshapes) by aliasing their output to their input's bytes;
6. plan the arena from value lifetimes (memory_plan.py) and prove the plan safe (plan_verifier.py);
7. bind every step to views of the arena: the instruction list (instructions.py).
A graph with program state is loaded functional, and its one state step (method_state.py) narrows a KV
cache's update after 4, takes the state out of the arena plan before 6, and binds the state's buffers
after 6.
"""

from __future__ import annotations

import contextlib
import functools
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from edgerun.backends.base import Backend, CompiledPartition
from edgerun.errors import EdgerunError
from edgerun.ir.decompose import decomposed
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.state import on_functional
from edgerun.ir.subgraphs import is_control_flow
from edgerun.ir.verifier import verify
from edgerun.passes.common_subexpression_pass import merge_identical_constants, merge_identical_nodes
from edgerun.program import Program
from edgerun.runtime.arena_limit import check_arena_budget
from edgerun.runtime.control_flow import LoadBody, bind_control_flow
from edgerun.runtime.instructions import Instruction
from edgerun.runtime.loaded_program import LoadedParts, LoadedProgram
from edgerun.runtime.memory_plan import ArenaPlan, TensorLifetime, allocate_arena, plan_memory
from edgerun.runtime.method_state import MethodState
from edgerun.runtime.methods import RunnableProgram, has_methods_or_state, load_methods
from edgerun.runtime.partition import Partition, check_acyclic, partition_graph
from edgerun.runtime.placement import FALLBACK, assign_backends, claimed_by, lower_unclaimed, resolve_backends
from edgerun.runtime.placer import Placer
from edgerun.runtime.plan_verifier import verify_plan
from edgerun.runtime.schedule import Step, arena_views, find_aliases, value_lifetimes
from edgerun.runtime.specializing import SpecializingProgram, ValueSpecializer
from edgerun.runtime.state import StateStore


def load(source: str | os.PathLike[str] | Program | Graph,
         backends: Sequence[str | Backend] | str | None = None, *, placer: Placer | None = None,
         placement: Mapping[str, str] | None = None, algorithms: Mapping[str, str] | None = None,
         verify_weights: bool = True, alias_reshapes: bool = True, arena_limit: int | None = None,
         state: StateStore | None = None) -> RunnableProgram:
    """Make a program runnable on the given backends.

    `source`: a program file path, a Program, or a Graph. `backends`: names or instances in order of
    preference (default: reference alone), or one name; each node goes to the first that supports it, and
    reference takes the rest. `placement`: {node name: backend name} forced placements (the search's output,
    or a developer tool migrating ops one at a time); node names are those of the prepared graph, or of
    the fully lowered one (`prepare_graph(graph)`, what the developer tools see).
    `algorithms`: {node name: algorithm} for backends that offer a choice (Backend.algorithm_choices).
    `placer`: asked to place each concrete graph (runtime/placer.py) instead of the preference rules;
    `backends="auto"` is the search's placer: `edgerun.load` (edgerun.search.load) passes it here.
    `arena_limit`: the most arena bytes to allocate (default: EDGERUN_MAX_ARENA_BYTES, else 75% of available
    memory); a larger plan raises ArenaLimitError before anything is allocated.
    A program with several methods or with state loads every method (runtime/methods.py); `state` is the
    store one method's load binds (what that does for each method).
    """
    if isinstance(backends, str):
        if backends == "auto" or backends.startswith("auto:"):
            raise EdgerunError('backends="auto" is resolved by the load-time search: call edgerun.load(...) '
                               "(edgerun.search.load), not edgerun.runtime.load")
        backends = [backends]
    program, original = read_source(source, verify_weights)
    again = functools.partial(load, backends=backends, placer=placer, placement=placement, algorithms=algorithms,
                              alias_reshapes=alias_reshapes, arena_limit=arena_limit)
    if state is None and program is not None and has_methods_or_state(program):  # each method, one state store
        return load_methods(program, functools.partial(again, verify_weights=verify_weights))
    if original.symbols or isinstance(program, ValueSpecializer):  # a template: specialised per shape (and value)
        return SpecializingProgram(program or Program(original), functools.partial(again, state=state))
    if placer is not None:
        return load_placed(program, original, placer, placement=placement, alias_reshapes=alias_reshapes,
                           arena_limit=arena_limit, state=state)
    graph = prepare_graph(original, resolve_backends(backends, placement).values())
    if placement and not set(placement) <= {n.name for n in graph.nodes}:
        # Names of the fully lowered graph (what the developer tools show and migrate op by op): honour
        # them by lowering every composite before placement, as a backend claiming none would.
        graph = prepare_graph(original)
    return load_prepared(program, original, graph, backends, placement=placement, algorithms=algorithms,
                         alias_reshapes=alias_reshapes, arena_limit=arena_limit, state=state)


def load_placed(program: Program | None, original: Graph, placer: Placer, *,
                placement: Mapping[str, str] | None = None, alias_reshapes: bool = True,
                arena_limit: int | None = None, state: StateStore | None = None) -> LoadedProgram:
    """One concrete graph placed by `placer`; explicit `placement` entries override its choice. Candidates
    the placer loads to measure run on the program's state: it is copied before the first one loads and put
    back once the placer has chosen (only then: a placer that measures nothing copies nothing)."""
    graph = prepare_graph(original, placer.candidates())
    saved: list[dict[str, np.ndarray]] = []

    def load_candidate(candidate: Mapping[str, str], algorithms: Mapping[str, str],
                       backends: Sequence[Backend]) -> LoadedProgram:
        if state is not None and not saved:
            saved.append(state.snapshot())
        return load_prepared(program, graph, graph, backends, placement=candidate, algorithms=algorithms,
                             arena_limit=arena_limit, state=state)

    placed = placer.place(program, graph, load_candidate)
    if state is not None and saved:
        state.assign(saved.pop())  # freed before the winner is built: its sessions reuse the memory
    if placed.loaded is not None and not placement and alias_reshapes:
        loaded = placed.loaded  # the measured winner is already loaded: no second build
    else:
        if placed.loaded is not None:  # measured, but built differently here: freed before the build
            placed.loaded.release()
        loaded = load_prepared(program, original, graph, placed.backends,
                               placement={**placed.placement, **(placement or {})}, algorithms=placed.algorithms,
                               alias_reshapes=alias_reshapes, arena_limit=arena_limit, state=state)
    loaded.search = placed.record
    return loaded


def load_prepared(program: Program | None, original: Graph, graph: Graph,
                  backends: Sequence[str | Backend] | None, *, placement: Mapping[str, str] | None = None,
                  algorithms: Mapping[str, str] | None = None, alias_reshapes: bool = True,
                  arena_limit: int | None = None, state: StateStore | None = None) -> LoadedProgram:
    """`load` from an already prepared graph (`prepare_graph(original, candidates)`), in the steps the module
    docstring lists. A graph with state binds the buffers of `state`: the state's one step (MethodState,
    runtime/method_state.py) runs at three points and is a no-op for a graph without state."""
    method_state = MethodState(graph, state)
    registry = resolve_backends(backends, placement)
    graph, partitions = place_and_partition(method_state.graph, registry, backends, placement)
    method_state.graph = graph  # lowered where composites landed on backends that do not keep them
    if program is not None:  # pages an earlier load touched (a candidate the search measured)
        program.drop_resident_weights()
    # While the backends read the weights they keep in their own form, the pages are given back as they go.
    with program.weights_given_back() if program is not None else contextlib.nullcontext():
        compiled = [compile_partition(p, graph, registry, algorithms or {}) for p in partitions]
    steps = build_schedule(partitions, compiled)
    method_state.narrow(steps)
    arena_aliases, const_aliases, elided = find_aliases(steps, graph) if alias_reshapes else ({}, {}, set())
    lifetimes = value_lifetimes(steps, graph, skip=const_aliases)
    method_state.plan(steps, lifetimes, arena_aliases, compiled)
    plan, arena, views = plan_arena(graph, lifetimes, arena_aliases, const_aliases, arena_limit)
    graph, binding = method_state.bind(views, steps, compiled)
    instructions = build_instructions(steps, elided, partitions, compiled, views,
                                      functools.partial(_load_body, backends=backends, arena_limit=arena_limit))
    return LoadedProgram(LoadedParts(graph, partitions, compiled, plan, arena, views, instructions, program,
                                      dict(registry), list(original.outputs), binding))


def place_and_partition(graph: Graph, registry: Mapping[str, Backend], backends: Sequence[str | Backend] | None,
                        placement: Mapping[str, str] | None) -> tuple[Graph, list[Partition]]:
    """Step 2: each node on a backend, the composites placed where they are not kept lowered there, and
    the graph cut into acyclic single-backend partitions."""
    preference = [b if isinstance(b, str) else b.name for b in (backends or [FALLBACK])]
    assignment = assign_backends(graph, registry, preference, placement)
    graph, assignment = lower_unclaimed(graph, assignment, registry)
    partitions = partition_graph(graph, assignment)
    check_acyclic(partitions, graph)
    return graph, partitions


def plan_arena(graph: Graph, lifetimes: Mapping[str, TensorLifetime], arena_aliases: Mapping[str, str],
               const_aliases: Mapping[str, str], arena_limit: int | None,
               ) -> tuple[ArenaPlan, np.ndarray, dict[str, np.ndarray]]:
    """Step 6 and the views of step 7: the arena planned from lifetimes and proved safe, checked against the
    limit before anything is allocated (a clear error, never a MemoryError), allocated, and every value's
    array."""
    plan = plan_memory(lifetimes, arena_aliases)
    verify_plan(plan, lifetimes)
    check_arena_budget(plan.arena_bytes, arena_limit)
    arena = allocate_arena(plan.arena_bytes)
    return plan, arena, bind_views(graph, plan, arena, const_aliases)


def read_source(source: object, verify_weights: bool = True) -> tuple[Program | None, Graph]:
    """(the Program, if there is one, and its graph) from a path, a Program or a Graph."""
    if isinstance(source, Graph):
        return None, source
    if isinstance(source, (str, os.PathLike)):
        source = Program.read(source, verify_weights=verify_weights)
    if isinstance(source, Program):
        program = _saved_value_template(source)
        return program, program.graph
    raise EdgerunError(f"load() takes a program path, a Program or a Graph, not {type(source).__name__}")


def _saved_value_template(program: Program) -> Program:
    """A program file holding a saved ONNX value template is the ONNX frontend's to open (it re-runs the
    import per value, which needs onnx); the runtime needs numpy alone, so it says how and stops."""
    if "value_template" in program.metadata and type(program) is Program:
        raise EdgerunError(f"this program file is an ONNX model specialised per value of its inputs "
                           f"{program.metadata['value_template'].get('value_inputs')}: open it with "
                           "edgerun.frontends.onnx.ValueTemplate.from_program(Program.read(path)) (needs the onnx "
                           "package) and load that, or save a program with those inputs frozen (constant_inputs=)")
    return program


def prepare_graph(graph: Graph, candidates: Iterable[Backend] = ()) -> Graph:
    """The graph the runtime places: composites no candidate backend keeps whole are decomposed (on a copy,
    output names kept: callers know outputs by name), and the result verified."""
    keep = claimed_by(candidates)

    def lower(g: Graph) -> Graph:
        lowered = decomposed(g, keep)
        if lowered is not g:
            # Composites decompose one by one, so pieces that depend only on shared values repeat: each
            # layer's cache_attention gathers the same rotary rows at the same positions. One copy is kept.
            # Only the constants the decompositions added are compared (hashing every weight costs a load).
            merge_identical_constants(lowered, among=set(lowered.constants) - set(g.constants))
            merge_identical_nodes(lowered)
            lowered.prune_specs()
        return lowered

    graph = on_functional(graph, lower)
    verify(graph)
    return graph


def compile_partition(part: Partition, graph: Graph, registry: Mapping[str, Backend],
                      algorithms: Mapping[str, str] | None = None) -> CompiledPartition:
    subgraph = part.subgraph(graph)
    backend = registry[part.backend]
    chosen = {n.name: algorithms[n.name] for n in part.nodes if n.name in algorithms} if algorithms else {}
    try:
        # Only a backend that declares algorithm choices is ever given some (Backend.algorithm_choices).
        return backend.compile_with_algorithms(subgraph, chosen) if chosen else backend.compile(subgraph)
    except Exception as exc:
        if part.backend == FALLBACK:
            raise
        warnings.warn(f"backend {part.backend!r} failed to compile partition {part.index} "
                      f"({len(part.nodes)} ops): {type(exc).__name__}: {exc}; running it on {FALLBACK}",
                      RuntimeWarning, stacklevel=3)
        part.backend = FALLBACK
        return registry[FALLBACK].compile(subgraph)


def build_schedule(partitions: Sequence[Partition], compiled: Sequence[CompiledPartition]) -> list[Step]:
    steps: list[Step] = []
    for part, cp in zip(partitions, compiled):
        if cp.bind_node is not None:
            steps += [Step(tuple(i for i in n.inputs if i), tuple(n.outputs), part.index, n) for n in part.nodes]
        else:
            steps.append(Step(tuple(cp.graph.inputs), tuple(cp.graph.outputs), part.index, None))
    return steps


def bind_views(graph: Graph, plan: ArenaPlan, arena: np.ndarray,
               const_aliases: Mapping[str, str]) -> dict[str, np.ndarray]:
    offsets = {v: plan.offset_of(v) for v in plan.values}
    views: dict[str, np.ndarray] = dict(graph.constants)
    views.update(arena_views(arena, graph, offsets))
    for name, spec in graph.specs.items():  # a string tensor's elements are references: never arena bytes
        if spec.dtype is DType.string and name not in views:
            views[name] = np.full(spec.shape, "", dtype=object)
    for value, const in const_aliases.items():
        views[value] = graph.constants[const].reshape(graph.specs[value].shape)
    return views


def _load_body(body: Graph, backends: Sequence[str | Backend] | None, arena_limit: int | None) -> LoadedProgram:
    """A control-flow body loaded as a program of its own, on the same backends (runtime/control_flow.py)."""
    return load_prepared(None, body, prepare_graph(body, resolve_backends(backends).values()), backends,
                         arena_limit=arena_limit)


def build_instructions(steps: Sequence[Step], elided: set[int], partitions: Sequence[Partition],
                       compiled: Sequence[CompiledPartition], views: Mapping[str, np.ndarray],
                       load_body: LoadBody | None = None) -> list[Instruction]:
    instructions = []
    for k, step in enumerate(steps):
        if k in elided:
            continue
        part, cp = partitions[step.partition], compiled[step.partition]
        if step.node is not None:
            assert cp.bind_node is not None
            if load_body is not None and is_control_flow(step.node.op):
                call = bind_control_flow(step.node, views, cp.graph, load_body)
            else:
                call = cp.bind_node(step.node, views)
            instructions.append(Instruction(call, step.node.op, step.node.name, part.backend, part.index,
                                            step.reads, step.writes))
        else:
            call = functools.partial(cp.run, [views[v] for v in cp.graph.inputs],
                                     [views[v] for v in cp.graph.outputs])
            instructions.append(Instruction(call, "partition", part.label, part.backend, part.index,
                                            step.reads, step.writes))
    return instructions
