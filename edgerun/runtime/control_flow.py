"""Control-flow nodes on a per-node backend (the reference): the oracle's meaning of the op (oracle/
control_flow.py), with each body loaded through the runtime once, at load time.

A backend that declares a control-flow op (Backend.control_flow) and compiles whole partitions (ONNX
Runtime) runs the node, bodies included, itself. A node that lands on the reference instead runs its bodies
as programs of their own: placed over the same backends, partitioned, planned and bound like the top level,
so a body's ops run on the fastest backend that has them (its pieces may land on ONNX Runtime even though
the node could not) and its values are memory-planned. Each call binds the node's arrays to the loaded
bodies; a loop runs its loaded body once per trip.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from edgerun.ir.graph import Graph, Node
from edgerun.ir.subgraphs import body_names
from edgerun.oracle.control_flow import run_control_flow
from edgerun.runtime.loaded_program import LoadedProgram

LoadBody = Callable[[Graph], LoadedProgram]  # a body (closed graph) -> it loaded on this load's backends


def bind_control_flow(node: Node, arrays: Mapping[str, np.ndarray], graph: Graph,
                      load_body: LoadBody) -> Callable[[], None]:
    """A call computing control-flow `node` (held by `graph`) from and into `arrays`, bodies loaded now."""
    bodies = {name: graph.subgraphs[name] for name in body_names(node)}
    loaded = {id(body): load_body(body) for body in bodies.values()}
    holder = Graph(subgraphs=bodies)
    ins = [arrays[i] for i in node.inputs if i]
    outs = [arrays[o] for o in node.outputs]

    def run_body(body: Graph, args: Sequence[np.ndarray]) -> list[np.ndarray]:
        return loaded[id(body)].run(list(args))

    def call() -> None:
        for dst, value in zip(outs, run_control_flow(node, ins, holder, run_body)):
            np.copyto(dst, value)
    return call
