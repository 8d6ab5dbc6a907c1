"""What every tool starts from: a program as the runtime executes it, and input sets read from .npz files.

The tools work on the decomposed graph (composites lowered, as `edgerun.runtime.load` runs it), so node
names in bundles, placements, reports and reproduction commands are the runtime's names.

A program with several methods is looked at one method at a time (`method=`, default the program's default
method). A method with state is looked at in its functional form (`ir/state.py`): the state it reads are
trailing inputs named as the states, its updates trailing outputs. Its input sets are a *sequence of calls*:
`call_sequence` starts from the program's initial state and feeds each call the state the reference left
after the one before (an input set may also give a state's value by name, which then replaces it). Every
tool then compares each call from the same state, so a divergence shows in the call and op that cause it,
not in every later call that inherits it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph
from edgerun.ir.state import StateSignature, has_state, to_functional
from edgerun.program import Program
from edgerun.runtime.loader import prepare_graph

InputSet = dict[str, np.ndarray]


@dataclass(frozen=True)
class ProgramState:
    """Where a method's functional graph keeps its state, and each state's value before the first call."""

    signature: StateSignature
    initial: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class LoadedGraph:
    graph: Graph  # decomposed and verified; a stateful method's functional form
    program: Program | None
    path: str | None
    method: str | None = None  # None: the program's only (or default) method
    state: ProgramState | None = None  # set when the method reads or writes state

    @property
    def program_hash(self) -> str | None:
        return self.program.program_hash() if self.program is not None else None

    @property
    def user_inputs(self) -> list[str]:
        """The inputs a caller passes (a stateful method's functional graph also takes its state)."""
        count = self.state.signature.user_inputs if self.state is not None else len(self.graph.inputs)
        return self.graph.inputs[:count]


def load_graph(source: str | os.PathLike[str] | Program | Graph, method: str | None = None) -> LoadedGraph:
    if isinstance(source, Graph):
        if method is not None:
            raise EdgerunError(f"method {method!r} given for a bare graph, which has one entry point")
        return _loaded(source, None, None, None)
    program, path = (source, None) if isinstance(source, Program) else \
        (Program.read(source), os.fspath(source))
    if method is not None and method not in program.methods:
        raise EdgerunError(f"the program has no method {method!r}; its methods are {sorted(program.methods)}")
    graph = program.graph if method is None else program.methods[method]
    named = method if method is not None and len(program.methods) > 1 else None
    return _loaded(graph, program, path, named)


def _loaded(graph: Graph, program: Program | None, path: str | None, method: str | None) -> LoadedGraph:
    graph = prepare_graph(graph)
    if not has_state(graph):
        return LoadedGraph(graph, program, path, method)
    functional, signature = to_functional(graph)
    initial = {n: np.asarray(program.state[n]) for n in signature.reads} if program is not None else {}
    missing = [n for n in signature.reads if n not in initial]
    if missing:
        raise EdgerunError(f"the graph reads state {missing} but has no program holding its initial value; "
                           "load the program file (or Program) instead of its bare graph")
    return LoadedGraph(functional, program, path, method, ProgramState(signature, initial))


def read_arrays(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The arrays of an .npz, by name."""
    where = os.fspath(path)
    if not os.path.exists(where):
        raise EdgerunError(f"no inputs file at {where}")
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not hasattr(npz, "files"):  # a bare .npy: one array, not named inputs
                raise EdgerunError(f"{where} holds one array (.npy), not named inputs: save them with "
                                   "numpy.savez(path, name=array, ...)")
            return {k: npz[k] for k in npz.files}
    except ValueError:
        # numpy takes anything that is neither a zip nor .npy for a pickle, and refuses pickles.
        raise EdgerunError(f"{where} is not an .npz of arrays: save inputs with numpy.savez(path, name=array, "
                           "...) or `edgerun zoo export NAME -o FILE --inputs NPZ`") from None
    except OSError as exc:
        raise EdgerunError(f"cannot read inputs from {where}: {exc}") from None


def read_inputs(path: str | os.PathLike[str], graph: Graph) -> InputSet:
    """An input set from an .npz: arrays named like the graph's inputs, or arr_0, arr_1... in order."""
    return bind_input_set(read_arrays(path), graph, os.fspath(path))


def call_sequence(loaded: LoadedGraph, calls: Sequence[Mapping[str, np.ndarray] | Sequence[np.ndarray]],
                  where: Sequence[str] | None = None) -> list[InputSet]:
    """Each call's input set for `loaded.graph`. Stateless: each call bound as it is. Stateful: each call
    completed with the state, the program's initial state for the first call and the reference's updates
    after each call for the next (a call that names a state gives its value instead)."""
    labels = list(where) if where is not None else [f"call {i + 1}" for i in range(len(calls))]
    if loaded.state is None:
        return [bind_input_set(arrays, loaded.graph, label) for arrays, label in zip(calls, labels)]
    from edgerun.oracle import interpret  # the reference decides the state each call starts from

    graph, signature = loaded.graph, loaded.state.signature
    state = dict(loaded.state.initial)
    out = []
    for arrays, label in zip(calls, labels):
        given = _by_name(arrays, loaded.user_inputs)
        unknown = sorted(set(given) - set(graph.inputs))
        if unknown:
            raise EdgerunError(f"{label} names {unknown}, which are neither inputs of the program "
                               f"({loaded.user_inputs}) nor its state ({list(signature.reads)})")
        bound = bind_input_set({**state, **given}, graph, label)
        out.append(bound)
        outputs = interpret(graph, bound, decompose=False)
        state = {name: bound[name] for name in signature.reads}
        state.update({name: outputs[index] for name, index in signature.updates})
    return out


def _by_name(arrays: Mapping[str, np.ndarray] | Sequence[np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Arrays by input name: a sequence or arr_0, arr_1... are the caller's inputs in order."""
    if not isinstance(arrays, Mapping):
        return dict(zip(names, arrays))
    if not set(names) <= set(arrays) and all(f"arr_{i}" in arrays for i in range(len(names))):
        return {name: arrays[f"arr_{i}"] for i, name in enumerate(names)}
    return dict(arrays)


def bind_input_set(arrays: Mapping[str, np.ndarray] | Sequence[np.ndarray], graph: Graph,
                   where: str = "inputs") -> InputSet:
    if not isinstance(arrays, Mapping):
        arrays = {name: a for name, a in zip(graph.inputs, arrays)}
    elif not set(graph.inputs) <= set(arrays) and all(f"arr_{i}" in arrays for i in range(len(graph.inputs))):
        arrays = {name: arrays[f"arr_{i}"] for i, name in enumerate(graph.inputs)}
    missing = [n for n in graph.inputs if n not in arrays]
    if missing:
        raise EdgerunError(f"{where} lacks {missing}; the program takes {graph.inputs}")
    out = {}
    for name in graph.inputs:
        spec = graph.specs[name]
        a = np.asarray(arrays[name])
        if a.shape != spec.shape:
            raise EdgerunError(f"{where}: input {name!r} must have shape {spec.shape}, got {a.shape}")
        out[name] = a.astype(spec.dtype.np, copy=False)
    return out


def save_inputs(path: str | os.PathLike[str], inputs: Mapping[str, np.ndarray]) -> None:
    arrays: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in inputs.items()}
    np.savez(path, **arrays)  # type: ignore[arg-type]


def random_inputs(graph: Graph, seed: int = 0, names: Sequence[str] | None = None) -> InputSet:
    """Inputs of the right specs (for `names`, default every graph input): U(-1, 1) floats, small
    non-negative integers, random bools."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs if names is None else names:
        spec = graph.specs[name]
        if spec.dtype.is_float:
            out[name] = rng.uniform(-1, 1, spec.shape).astype(spec.dtype.np)
        elif spec.dtype.value == "bool":
            out[name] = rng.random(spec.shape) < 0.5
        else:
            out[name] = rng.integers(0, 2, spec.shape).astype(spec.dtype.np)
    return out
