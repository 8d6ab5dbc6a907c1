"""Methods of one program share constants by name: one name, one array, in every method that uses it.

Frontends name constants per graph (`w_0`, `w_1`, ... in each), so two methods exported separately can use
one name for different data. `share_constants_by_name` renames those clashes apart; equal data under equal
names stays one constant (and the writer stores identical bytes once, whatever their names).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edgerun.ir.graph import Graph


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    if a is b:
        return True
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype == object:  # strings: their elements are objects, not bytes
        return bool(np.array_equal(a, b))
    return bool(np.array_equal(np.ascontiguousarray(a).reshape(-1).view(np.uint8),
                               np.ascontiguousarray(b).reshape(-1).view(np.uint8)))


def rename_value(graph: Graph, old: str, new: str) -> None:
    """Rename value `old` to `new` everywhere in `graph` (in place)."""
    graph.specs[new] = graph.specs.pop(old)
    if old in graph.constants:
        graph.constants[new] = graph.constants.pop(old)
    for node in graph.nodes:
        node.inputs = [new if i == old else i for i in node.inputs]
        node.outputs = [new if o == old else o for o in node.outputs]
    graph.inputs = [new if i == old else i for i in graph.inputs]
    graph.outputs = [new if o == old else o for o in graph.outputs]
    graph.state_updates = {s: new if v == old else v for s, v in graph.state_updates.items()}


def share_constants_by_name(methods: Mapping[str, Graph]) -> None:
    """Rename, in place, each constant whose name an earlier method uses for different data."""
    seen: dict[str, np.ndarray] = {}
    for method, graph in methods.items():
        for name in list(graph.constants):
            array = graph.constants[name]
            if name in seen and not same_bytes(seen[name], array):
                new = f"{name}.{method}"
                while new in seen or new in graph.specs:
                    new += "_"
                rename_value(graph, name, new)
                name = new
            seen.setdefault(name, array)
