"""The pass interface and the pipeline runner that records op counts before and after each pass."""

from __future__ import annotations

import functools
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import transform_bodies


@dataclass
class PassResult:
    graph: Graph
    changed: bool


@dataclass
class PassRecord:
    name: str
    ops_before: dict[str, int]
    ops_after: dict[str, int]
    seconds: float


class Pass(ABC):
    """A graph-to-graph rewrite. Subclasses set `name` and implement `call`; the input graph is theirs to modify."""

    name: str = "pass"

    @abstractmethod
    def call(self, graph: Graph) -> PassResult: ...


def _call(p: Pass, graph: Graph) -> Graph:
    return p.call(graph).graph


def run_pipeline(graph: Graph, passes: Sequence[Pass], verify_each: bool = True) -> tuple[Graph, list[PassRecord]]:
    import time

    from edgerun.ir.verifier import verify

    records = []
    for p in passes:
        before = graph.op_counts()
        t0 = time.perf_counter()
        graph = p.call(graph).graph
        transform_bodies(graph, functools.partial(_call, p))  # control-flow bodies: closed graphs of their own
        records.append(PassRecord(p.name, before, graph.op_counts(), time.perf_counter() - t0))
        if verify_each:
            verify(graph)
    return graph, records
