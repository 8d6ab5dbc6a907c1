"""The schedule: the linear order of steps the executor will run, and the value lifetimes it implies.

A step is one node of a partition whose backend binds nodes to the arena (reference), or one whole
partition of a delegate backend, whose internal values it keeps to itself. Step numbers start at 1: step 0
is "graph inputs arrive" and step len(steps)+1 is "graph outputs are copied out", so inputs and outputs get
honest lifetimes too. Lifetimes are inclusive at both ends, which keeps a node's outputs out of the bytes of
the inputs it reads, even ones it reads for the last time.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.region import Region
from edgerun.runtime.memory_plan import TensorLifetime


@dataclass(frozen=True)
class Step:
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    partition: int
    node: Node | None  # None: a delegate partition runs as one step


def is_noop_raster(node: Node, graph: Graph) -> bool:
    """A raster that copies its one source whole, in order: a reshape. Its output can share the input's bytes."""
    if node.op != "raster" or len([i for i in node.inputs if i]) != 1:
        return False
    regions = node.attrs.get("regions") or []
    if len(regions) != 1:
        return False
    src_spec, out_spec = graph.specs[node.inputs[0]], graph.specs[node.outputs[0]]
    return src_spec.dtype is out_spec.dtype and src_spec.numel == out_spec.numel \
        and Region.of(regions[0]).is_identity(out_spec.numel)


def find_aliases(steps: Sequence[Step], graph: Graph) -> tuple[dict[str, str], dict[str, str], set[int]]:
    """(arena aliases value -> root value, constant aliases value -> constant, elided step indices).

    Only node steps are elided; a delegate's internals are its own business. A no-op raster of a C-contiguous
    constant becomes a reshaped view of the (memory-mapped) constant, outside the arena.
    """
    arena: dict[str, str] = {}
    const: dict[str, str] = {}
    elided: set[int] = set()
    for k, step in enumerate(steps):
        node = step.node
        if node is None or not is_noop_raster(node, graph):
            continue
        src, out = node.inputs[0], node.outputs[0]
        if graph.specs[out].dtype is DType.string:  # string values are outside the arena: the raster copies
            continue
        if src in const or (src in graph.constants and graph.constants[src].flags.c_contiguous):
            const[out] = const.get(src, src)
        elif src in graph.constants:
            continue
        else:
            arena[out] = arena.get(src, src)
        elided.add(k)
    return arena, const, elided


def value_lifetimes(steps: Sequence[Step], graph: Graph, skip: Collection[str] = ()) -> dict[str, TensorLifetime]:
    """Lifetime of every value the arena holds: graph inputs and every value a step writes.

    Constants and values in `skip` (views of constants) are not in the arena. An elided step (a no-op
    raster whose output aliases its input) still counts as defining its output and reading its input.
    """
    first: dict[str, int] = {name: 0 for name in graph.inputs}
    last: dict[str, int] = dict(first)
    for k, step in enumerate(steps, start=1):
        for v in step.writes:
            first.setdefault(v, k)
            last.setdefault(v, k)
        for v in step.reads:
            if v in last:
                last[v] = max(last[v], k)
    last.update((v, len(steps) + 1) for v in graph.outputs if v in last)
    skip = set(skip) | set(graph.constants)
    # Strings hold objects, not bytes: bind_views gives each its own array, outside the arena.
    return {v: TensorLifetime(v, graph.specs[v].nbytes, f, last[v]) for v, f in first.items()
            if v not in skip and graph.specs[v].dtype is not DType.string}


def arena_views(arena: np.ndarray, graph: Graph, offsets: Mapping[str, int]) -> dict[str, np.ndarray]:
    """A numpy view of the arena for each planned value, shaped and typed by its spec."""
    specs = graph.specs
    return {name: arena[off:off + specs[name].nbytes].view(specs[name].dtype.np).reshape(specs[name].shape)
            for name, off in offsets.items()}
