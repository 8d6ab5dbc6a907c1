"""The executable meaning of the control-flow ops (ir/ops/control_flow_ops.py): cond, while_loop, scan.

Each runs its closed bodies through a `BodyRunner` (the interpreter's node walk, or the runtime's loaded
bodies), binding node inputs to body inputs and body outputs to node results by position. The runner gets
the body graphs themselves (a runner keys on them) and lowers what it needs to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph, Node
from edgerun.ir.subgraphs import bodies_of

# Runs one body on its inputs (in body.inputs order) and returns its outputs (in body.outputs order).
BodyRunner = Callable[[Graph, Sequence[np.ndarray]], list[np.ndarray]]


def truth(value: np.ndarray, what: str) -> bool:
    """The value of a one-element bool (a cond predicate, a loop condition)."""
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise EdgerunError(f"{what} must have one element, got shape {np.shape(value)}")
    return bool(flat[0])


def run_control_flow(node: Node, args: Sequence[np.ndarray], graph: Graph, run_body: BodyRunner) -> list[np.ndarray]:
    """Fresh result arrays of control-flow `node` (held by `graph`) computed from `args`."""
    if node.op == "cond":
        side = "then" if truth(args[0], f"cond {node.name!r} predicate") else "else"
        if node.attrs[side] == "":
            raise EdgerunError(f"cond {node.name!r} took its {side} branch, which cannot run at this program's "
                               f"shapes: {node.attrs.get('unreachable', '')}")
        return _fresh(run_body(graph.subgraphs[node.attrs[side]], args[1:]))
    bodies = bodies_of(node, graph)
    if node.op == "while_loop":
        return _while_loop(node, args, bodies[0], bodies[1], run_body)
    if node.op == "scan":
        return _scan(node, args, bodies[0], run_body)
    raise EdgerunError(f"node {node.name!r}: {node.op} is not a control-flow op the oracle knows")


def _fresh(values: Sequence[np.ndarray]) -> list[np.ndarray]:
    return [np.array(v) for v in values]  # a body may return one of its inputs: never hand out an alias


def _while_loop(node: Node, args: Sequence[np.ndarray], cond: Graph, body: Graph,
                run_body: BodyRunner) -> list[np.ndarray]:
    k = int(node.attrs["num_carried"])
    carried, invariants = list(args[:k]), list(args[k:])
    what = f"while_loop {node.name!r} condition"
    while truth(run_body(cond, [*carried, *invariants])[0], what):
        carried = run_body(body, [*carried, *invariants])
    return _fresh(carried)


def _scan(node: Node, args: Sequence[np.ndarray], body: Graph, run_body: BodyRunner) -> list[np.ndarray]:
    k, m = int(node.attrs["num_carried"]), int(node.attrs["num_sequences"])
    carried, sequences, invariants = list(args[:k]), list(args[k:k + m]), list(args[k + m:])
    length = sequences[0].shape[0] if sequences else int(node.attrs["length"])
    ys: list[list[np.ndarray]] = [[] for _ in range(len(body.outputs) - k)]
    for t in range(length):
        step = run_body(body, [*carried, *(s[t] for s in sequences), *invariants])
        carried = step[:k]
        for j, y in enumerate(step[k:]):
            ys[j].append(y)
    stacked = [np.stack(y) for y in ys]
    return [*_fresh(carried), *stacked]
