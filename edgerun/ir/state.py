"""Program state in a graph: reads through `Graph.state_inputs`, writes through `Graph.state_updates`.

State is a set of named persistent tensors owned by the program (static shape, initial value stored like a
weight). A method graph reads a state value under the state's own name and names, per state it changes,
the value that becomes the state's new value at the end of a call.

Most of the compiler never needs to know: `to_functional` turns a stateful graph into an ordinary one whose
extra inputs are the state reads and whose extra outputs are the updates (what torch.export's
functionalisation does), every pass, the partitioner and the memory planner work on that, and
`from_functional` moves the state back. `on_functional` wraps a graph -> graph transform that way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from edgerun.errors import VerificationError
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec


@dataclass(frozen=True)
class StateSignature:
    """Where a functional graph keeps its state: inputs past `user_inputs` are state reads (named as the
    states), and state `name` takes the value of output `updates[name]` (an index into outputs)."""

    user_inputs: int
    user_outputs: int
    reads: tuple[str, ...]
    updates: tuple[tuple[str, int], ...]


def has_state(graph: Graph) -> bool:
    return bool(graph.state_inputs or graph.state_updates)


def to_functional(graph: Graph) -> tuple[Graph, StateSignature]:
    """A copy whose state reads are trailing inputs and whose updates are trailing (or shared) outputs.

    An update that keeps a state as it is (the value is the state's own read) is dropped: it changes
    nothing. An update value that is already an output shares that output's place.
    """
    functional = graph.copy()
    functional.state_inputs, functional.state_updates = [], {}
    functional.inputs = list(graph.inputs) + list(graph.state_inputs)
    updates = []
    for name, value in graph.state_updates.items():
        if value == name:
            continue
        if value not in functional.outputs:
            functional.outputs.append(value)
        updates.append((name, functional.outputs.index(value)))
    signature = StateSignature(len(graph.inputs), len(graph.outputs), tuple(graph.state_inputs), tuple(updates))
    return functional, signature


def from_functional(functional: Graph, signature: StateSignature) -> Graph:
    """Inverse of to_functional, on the (possibly transformed) functional graph, in place; returns it."""
    outputs = functional.outputs
    functional.state_updates = {name: outputs[index] for name, index in signature.updates}
    functional.state_inputs = list(functional.inputs[signature.user_inputs:])
    functional.inputs = functional.inputs[:signature.user_inputs]
    functional.outputs = outputs[:signature.user_outputs]
    return functional


def on_functional(graph: Graph, transform: Callable[[Graph], Graph]) -> Graph:
    """`transform(graph)`, run on the functional form when the graph has state (passes need not know)."""
    if not has_state(graph):
        return transform(graph)
    functional, signature = to_functional(graph)
    return from_functional(transform(functional), signature)


def verify_state(graph: Graph) -> set[str]:
    """Check the state fields; returns the state values the graph reads (defined before any node)."""
    reads: set[str] = set()
    for name in graph.state_inputs:
        if name in reads:
            raise VerificationError(f"state {name!r} is read twice (listed twice in state_inputs)")
        if name in graph.inputs or name in graph.constants:
            raise VerificationError(f"state {name!r} is also a graph input or a constant")
        if name not in graph.specs:
            raise VerificationError(f"state {name!r} has no TensorSpec")
        reads.add(name)
    for node in graph.nodes:
        for out in node.outputs:
            if out in reads:
                raise VerificationError(f"node {node.name!r} redefines state value {out!r}")
    defined = set(graph.inputs) | set(graph.constants) | reads | set(graph.producers())
    for name, value in graph.state_updates.items():
        if value not in defined:
            raise VerificationError(f"the update of state {name!r} reads {value!r}, which is never defined")
        if name in graph.specs and name in reads and graph.specs[value] != graph.specs[name]:
            raise VerificationError(f"the update of state {name!r} is {graph.specs[value]}, the state is "
                                    f"{graph.specs[name]}")
    return reads


def check_against_state(graph: Graph, state: Mapping[str, TensorSpec], method: str = "forward") -> None:
    """Every state a method reads or writes is a state of the program, with the state's spec."""
    for name in graph.state_inputs:
        if name not in state:
            raise VerificationError(f"method {method!r} reads state {name!r}, which the program does not have "
                                    f"(its state: {sorted(state)})")
        if graph.specs[name] != state[name]:
            raise VerificationError(f"method {method!r} reads state {name!r} as {graph.specs[name]}, the "
                                    f"state is {state[name]}")
    for name, value in graph.state_updates.items():
        if name not in state:
            raise VerificationError(f"method {method!r} updates state {name!r}, which the program does not "
                                    f"have (its state: {sorted(state)})")
        if graph.specs[value] != state[name]:
            raise VerificationError(f"method {method!r} updates state {name!r} with {value!r} of "
                                    f"{graph.specs[value]}, the state is {state[name]}")
