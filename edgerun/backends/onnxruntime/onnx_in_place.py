"""Which outputs of a partition's ONNX graph may be written over one of its inputs' buffers.

A training step updates each weight and optimizer moment: the update is a graph output of the weight's
shape, the weight a graph input. Handed the state's buffer for both (CompiledPartition.overwrites_inputs,
runtime/state.py), ONNX Runtime writes the new value in place and the runtime copies nothing after the
call (for an MLP's 784x256 weight and its momentum, two 800 KB copies a step).

That is safe when every node reading the input has run before the node that writes the output starts: each
reader is an ancestor of the writer (ONNX Runtime runs a node after all of its inputs' producers), or is
the writer itself, elementwise, reading the input at the output's own shape (element i is read before
element i is written, and by nothing else). Nothing else writes the buffer: ONNX Runtime never reuses a
graph input's memory for intermediate values.

The runtime uses a declared pair only where the output is the update of the state that the input reads;
other pairs cost nothing (unlike GroupQueryAttention's, the runner does not stage a copy for them).
"""

from __future__ import annotations

from collections import deque
from typing import Any

# Ops whose output element i is computed from their operands' elements i alone (at equal shapes).
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Neg", "Abs", "Sqrt", "Relu", "Max", "Min",
                         "Identity"})


def _types(graph: Any) -> dict[str, tuple[int, tuple[int, ...]]]:
    found = {}
    for v in [*graph.input, *graph.output]:
        t = v.type.tensor_type
        found[v.name] = (t.elem_type, tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim))
    return found


def may_overwrite(graph: Any, candidates: set[str]) -> dict[str, str]:
    """Output -> the graph input (one of `candidates`) whose buffer it may be computed in, per the rule
    above; of several, the one fewest nodes upstream of the output's writer (a weight's new value over the
    weight it subtracts from, a moment's over the moment it scales)."""
    types = _types(graph)
    initializers = {t.name for t in graph.initializer}
    outputs = [v.name for v in graph.output]
    inputs = ({v.name for v in graph.input} & candidates) - initializers - set(outputs)
    nodes = list(graph.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(nodes):
        for i in set(n.input):
            if i in inputs:
                readers.setdefault(i, []).append(k)

    def ancestors(k: int) -> dict[int, int]:  # node -> its distance upstream of k
        seen = {k: 0}
        queue = deque([k])
        while queue:
            j = queue.popleft()
            for i in nodes[j].input:
                up = producer.get(i)
                if up is not None and up not in seen:
                    seen[up] = seen[j] + 1
                    queue.append(up)
        return seen

    found: dict[str, str] = {}
    used: set[str] = set()
    for out in outputs:
        made_by = producer.get(out)
        shape = types.get(out)
        if made_by is None or shape is None or -1 in shape[1] or outputs.count(out) != 1:
            continue
        k = made_by
        writer = nodes[k]
        upstream = ancestors(k)
        best: tuple[int, str] | None = None
        for name in inputs - used:
            if types.get(name) != shape:
                continue
            reads = readers.get(name, [])
            if not reads:
                continue
            if any(r == k and (writer.op_type not in ELEMENTWISE) for r in reads):
                continue
            if not all(r == k or r in upstream for r in reads):
                continue
            distance = min(upstream.get(r, 0) for r in reads)
            if best is None or distance < best[0]:
                best = (distance, name)
        if best is not None:
            found[out] = best[1]
            used.add(best[1])
    return found
