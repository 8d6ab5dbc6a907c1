"""Weights files: trained weights by name, apart from the program (ExecuTorch's program/data split).

A weights file is a program file with no nodes whose state holds the weights, marked in its metadata; it is
written and read by the program file's own writer and reader, so it gets the same header, checksums and
validation. `apply_weights(program, path)` gives an inference program the file's weights by name, so a
fine-tuned model ships without exporting again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from edgerun.errors import EdgerunError, ProgramFormatError
from edgerun.ir.graph import Graph
from edgerun.ir.state import on_functional
from edgerun.passes.pipeline import optimize as optimize_graph
from edgerun.program import Program

KIND = "edgerun weights"


def write_weights(path: str | os.PathLike[str], weights: Mapping[str, np.ndarray], source: str | None = None) -> None:
    """Save `weights` (name -> array) as a weights file."""
    if not weights:
        raise EdgerunError("no weights to save")
    metadata = {"kind": KIND, "weights": sorted(weights)}
    if source:
        metadata["source"] = source
    Program.from_methods({"forward": Graph()}, state={n: np.ascontiguousarray(a) for n, a in weights.items()},
                         metadata=metadata).save(path)


def read_weights(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """The weights of a weights file, by name (the file is validated as a program file is)."""
    program = Program.read(path, mmap=False)
    if program.metadata.get("kind") != KIND or program.graph.nodes:
        raise ProgramFormatError(f"{os.fspath(path)!r} is a program file, not a weights file")
    return {name: np.array(array) for name, array in program.state.items()}


def apply_weights(program: Program, weights: str | os.PathLike[str] | Mapping[str, np.ndarray], *,
                  optimize: bool = True) -> Program:
    """A copy of `program` whose weights named in `weights` (a weights file or a mapping) take those values,
    then (with `optimize`) run through the default pass pipeline, which folds what the new weights allow
    (a linear layer's weight transpose, a batch norm into its convolution), as export does.

    Every name must be a weight of the program with the same shape and dtype. The program is one whose
    weights carry the names training used: `export_for_training(module, inputs)[0]` for a torch module."""
    values = read_weights(weights) if isinstance(weights, str | os.PathLike) else dict(weights)
    graph = program.graph.copy()
    for name, array in values.items():
        if name not in graph.constants:
            raise EdgerunError(f"the program has no weight {name!r} (the weights file was made for another program)")
        old = graph.constants[name]
        if array.shape != old.shape or array.dtype != old.dtype:
            raise EdgerunError(f"weight {name!r} is {array.dtype}{list(array.shape)} in the file, "
                               f"{old.dtype}{list(old.shape)} in the program")
        graph.constants[name] = array
    if optimize:
        graph = on_functional(graph, lambda functional: optimize_graph(functional)[0])
    return Program(graph, dict(program.metadata), state=dict(program.state))
