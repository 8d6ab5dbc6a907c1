"""What every tool starts from: a program as the runtime executes it, and input sets read from .npz files.

The tools work on the decomposed graph (composites lowered, as `edgerun.runtime.load` runs it), so node
names in bundles, placements, reports and reproduction commands are the runtime's names.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph
from edgerun.program import Program
from edgerun.runtime.loader import prepare_graph

InputSet = dict[str, np.ndarray]


@dataclass(frozen=True)
class LoadedGraph:
    graph: Graph  # decomposed and verified
    program: Program | None
    path: str | None

    @property
    def program_hash(self) -> str | None:
        return self.program.program_hash() if self.program is not None else None


def load_graph(source: str | os.PathLike[str] | Program | Graph) -> LoadedGraph:
    if isinstance(source, Graph):
        return LoadedGraph(prepare_graph(source), None, None)
    if isinstance(source, Program):
        return LoadedGraph(prepare_graph(source.graph), source, None)
    program = Program.read(source)
    return LoadedGraph(prepare_graph(program.graph), program, os.fspath(source))


def read_inputs(path: str | os.PathLike[str], graph: Graph) -> InputSet:
    """An input set from an .npz: arrays named like the graph's inputs, or arr_0, arr_1... in order."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError) as exc:
        raise EdgerunError(f"cannot read inputs from {os.fspath(path)!r}: {exc}") from None
    return bind_input_set(arrays, graph, os.fspath(path))


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


def random_inputs(graph: Graph, seed: int = 0) -> InputSet:
    """Inputs of the right specs: U(-1, 1) floats, small non-negative integers, random bools."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in graph.inputs:
        spec = graph.specs[name]
        if spec.dtype.is_float:
            out[name] = rng.uniform(-1, 1, spec.shape).astype(spec.dtype.np)
        elif spec.dtype.value == "bool":
            out[name] = rng.random(spec.shape) < 0.5
        else:
            out[name] = rng.integers(0, 2, spec.shape).astype(spec.dtype.np)
    return out
