"""CommonSubexpressionPass: identical constants become one, then identical nodes (same op, inputs, attrs) do.

Every op in the IR is pure, so two nodes with the same op, the same inputs and the same attributes compute
the same values. Softmax's decomposition computes exp(x - max) twice, for instance; deduplicated
constants (the many scalar zeros of ReLU) let more nodes match.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection

from edgerun.ir.graph import Graph
from edgerun.passes.base import Pass, PassResult


def _rename_inputs(graph: Graph, rename: dict[str, str]) -> None:
    for node in graph.nodes:
        node.inputs = [rename.get(i, i) for i in node.inputs]


def merge_identical_constants(graph: Graph, among: Collection[str] | None = None) -> bool:
    """Make every reader of a constant read the first constant with the same dtype, shape and bytes
    (only the constants named in `among` when given)."""
    pinned = set(graph.inputs) | set(graph.outputs)
    by_type: dict[tuple[str, tuple[int, ...]], list[str]] = {}
    for name, array in graph.constants.items():
        if name not in pinned and (among is None or name in among):
            by_type.setdefault((array.dtype.str, tuple(array.shape)), []).append(name)
    rename: dict[str, str] = {}
    for names in by_type.values():
        if len(names) < 2:
            continue  # a weight of a shape nothing else has is never hashed
        first: dict[str, str] = {}
        for name in names:
            digest = hashlib.sha256(graph.constants[name].tobytes()).hexdigest()
            if digest in first:
                rename[name] = first[digest]
            else:
                first[digest] = name
    if rename:
        _rename_inputs(graph, rename)
    return bool(rename)


def merge_identical_nodes(graph: Graph, ops: frozenset[str] | None = None) -> bool:
    """Drop nodes that repeat an earlier node (restricted to `ops` when given); their readers use the first.

    A node whose outputs are graph outputs stays, so output names never change. A node marked "recomputed"
    (passes/autodiff.py: a forward value computed again for backward so it need not be kept) stays apart.
    """
    seen: dict[str, list[str]] = {}
    rename: dict[str, str] = {}
    kept = []
    for node in graph.nodes:
        node.inputs = [rename.get(i, i) for i in node.inputs]
        if (ops is not None and node.op not in ops) or "recomputed" in node.meta:
            kept.append(node)
            continue
        key = json.dumps([node.op, node.inputs, node.attrs], sort_keys=True, default=str)
        earlier = seen.get(key)
        if earlier is None or any(o in graph.outputs for o in node.outputs):
            seen.setdefault(key, node.outputs)
            kept.append(node)
            continue
        rename.update(zip(node.outputs, earlier))
    changed = len(kept) != len(graph.nodes)
    graph.nodes = kept
    return changed


class CommonSubexpressionPass(Pass):
    """Merge identical constants and identical nodes."""

    name = "cse"

    def call(self, graph: Graph) -> PassResult:
        changed = merge_identical_constants(graph)
        changed |= merge_identical_nodes(graph)
        graph.prune_specs()
        return PassResult(graph, changed)
