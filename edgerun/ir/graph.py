"""Graph, Node: the IR every frontend produces and every pass, program file and backend consumes.

Values are named by strings. A value is a graph input, a constant (weights, held as numpy arrays), or the
output of exactly one node. Every value has a TensorSpec in `Graph.specs`. Attributes are JSON values only
(numbers, strings, bools, lists, dicts), so a graph serialises without pickle.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.ir.dtypes import DType
from edgerun.ir.tensor_spec import TensorSpec


@dataclass
class Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    # Where the node came from: module_path, source (file:line), frontend op name. Kept for error messages
    # and the developer tools; never affects semantics.
    meta: dict[str, str] = field(default_factory=dict)
    name: str = ""

    def __repr__(self) -> str:
        return f"Node({self.name or '?'}: {self.op}({', '.join(self.inputs)}) -> {', '.join(self.outputs)})"


@dataclass
class Graph:
    inputs: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    nodes: list[Node] = field(default_factory=list)
    specs: dict[str, TensorSpec] = field(default_factory=dict)
    constants: dict[str, np.ndarray] = field(default_factory=dict)
    # Program state (edgerun/ir/state.py): values this graph reads from the program's persistent state
    # (defined by the state, not by the caller), and state name -> the value that becomes its new value at
    # the end of a call. A state value's name is the state's name.
    state_inputs: list[str] = field(default_factory=list)
    state_updates: dict[str, str] = field(default_factory=dict)
    # Bodies of control-flow nodes (cond, while_loop, scan), by the name their node's attrs give. A body is
    # closed: everything it reads is one of its inputs or constants (ir/subgraphs.py).
    subgraphs: dict[str, Graph] = field(default_factory=dict)
    _counter: Iterator[int] = field(default_factory=itertools.count, repr=False, compare=False)
    # Symbolic dimensions (ir/symbolic.py) the specs may use: name -> inclusive (min, max). Empty for a
    # static graph; a graph with symbols is a template the runtime specialises per concrete shape.
    symbols: dict[str, tuple[int, int]] = field(default_factory=dict)

    # -- construction ------------------------------------------------------------------------------
    def fresh_name(self, hint: str = "v") -> str:
        while True:
            name = f"{hint}_{next(self._counter)}"
            if name not in self.specs:
                return name

    def add_input(self, name: str, spec: TensorSpec) -> str:
        if name in self.specs:
            raise ValueError(f"value {name!r} already defined")
        self.specs[name] = spec
        self.inputs.append(name)
        return name

    def add_constant(self, data: np.ndarray, hint: str = "const", name: str | None = None) -> str:
        data = np.asarray(data)
        dtype = DType.of(data)
        name = name or self.fresh_name(hint)
        if name in self.specs:
            raise ValueError(f"value {name!r} already defined")
        self.specs[name] = TensorSpec(data.shape, dtype)
        self.constants[name] = data
        return name

    def add_node(self, op: str, inputs: Iterable[str], output_specs: Iterable[TensorSpec],
                 attrs: dict[str, Any] | None = None, meta: dict[str, str] | None = None,
                 hint: str | None = None) -> list[str]:
        outs = []
        for spec in output_specs:
            out = self.fresh_name(hint or op)
            self.specs[out] = spec
            outs.append(out)
        node = Node(op, list(inputs), outs, dict(attrs or {}), dict(meta or {}), name=outs[0] if outs else op)
        self.nodes.append(node)
        return outs

    # -- queries -----------------------------------------------------------------------------------
    def producers(self) -> dict[str, Node]:
        return {out: n for n in self.nodes for out in n.outputs}

    def consumers(self) -> dict[str, list[Node]]:
        users: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in n.inputs:
                if i:
                    users.setdefault(i, []).append(n)
        return users

    def op_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.op] = counts.get(n.op, 0) + 1
        return dict(sorted(counts.items()))

    def weight_bytes(self) -> int:
        return sum(int(a.nbytes) for a in self.constants.values()) + sum(b.weight_bytes() for b in self.subgraphs.values())

    def copy(self) -> Graph:
        """A structural copy; constant arrays are shared (they are never mutated in place)."""
        g = Graph(list(self.inputs), list(self.outputs), copy.deepcopy(self.nodes), dict(self.specs),
                  dict(self.constants), list(self.state_inputs), dict(self.state_updates),
                  {k: body.copy() for k, body in self.subgraphs.items()})
        g.symbols = dict(self.symbols)
        return g

    def toposort(self) -> None:
        """Reorder nodes so every node follows the producers of its inputs (stable for ordered graphs)."""
        produced = set(self.inputs) | set(self.constants) | set(self.state_inputs)
        pending = list(self.nodes)
        ordered: list[Node] = []
        while pending:
            rest = []
            for n in pending:
                if all((not i) or i in produced for i in n.inputs):
                    ordered.append(n)
                    produced.update(n.outputs)
                else:
                    rest.append(n)
            if len(rest) == len(pending):
                names = ", ".join(n.name for n in rest[:5])
                from edgerun.errors import VerificationError
                raise VerificationError(f"graph has a cycle or undefined inputs among: {names}")
            pending = rest
        self.nodes = ordered

    def prune_specs(self) -> None:
        """Drop specs and constants of values nothing defines or uses any more."""
        live = set(self.inputs) | set(self.outputs) | set(self.state_inputs) | set(self.state_updates.values())
        for n in self.nodes:
            live.update(i for i in n.inputs if i)
            live.update(n.outputs)
        self.specs = {k: v for k, v in self.specs.items() if k in live}
        self.constants = {k: v for k, v in self.constants.items() if k in live}
