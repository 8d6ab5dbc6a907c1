"""One way to make a program: a frontend's graph -> the default pass pipeline -> Program.

`edgerun.export` (torch), `edgerun.from_onnx`, `edgerun import-onnx` and `edgerun zoo export` all end here,
so every program file is optimised the same way and carries the same metadata (producer, version, frontend,
and the per-pass op counts under `passes`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edgerun.ir.graph import Graph
from edgerun.ir.state import on_functional
from edgerun.passes.base import PassRecord
from edgerun.passes.pipeline import METADATA_KEY, optimize, records_to_json, template_pipeline
from edgerun.program.program import Program, default_metadata


def optimize_keeping_state(graph: Graph) -> tuple[Graph, list[PassRecord]]:
    """The default pipeline (a template's: only passes safe on symbols); on a graph with state it runs on
    the functional form (ir/state.py)."""
    records: list[PassRecord] = []

    def run(functional: Graph) -> Graph:
        optimized, found = optimize(functional, template_pipeline() if functional.symbols else None)
        records.extend(found)
        return optimized

    return on_functional(graph, run), records


def make_program(graph: Graph, *, frontend: str, name: str | None = None, run_passes: bool = True,
                 state: Mapping[str, np.ndarray] | None = None) -> Program:
    """Wrap a frontend's verified graph as a Program, running the default pass pipeline first unless told not to.

    A graph with symbolic dimensions is a template: it gets only the passes that are safe on symbols, and
    the runtime runs the default pipeline per concrete shape."""
    metadata = default_metadata()
    if name:
        metadata["name"] = name
    metadata["frontend"] = frontend
    if run_passes:
        graph, records = optimize_keeping_state(graph)
        metadata[METADATA_KEY] = records_to_json(records)
    return Program(graph, metadata, state=dict(state or {}))
