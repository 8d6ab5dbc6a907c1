"""The backend interface: what a backend can run, what it costs, and how it compiles a partition.

A backend is one module under edgerun/backends/ exposing `create_backend() -> Backend` (see registry.py).
The runtime asks each backend, per node, `supports(node, graph)`; the search asks `cost(node, graph)` and
`transfer_cost(nbytes)`; the partitioner hands each backend maximal subgraphs of the nodes placed on it and
calls `compile(subgraph)`. A compiled partition runs on arrays the runtime owns (views of its one arena):
either as one call per partition (a delegate: ONNX Runtime, a remote device), or, when the backend offers
`bind_node`, as one pre-bound call per node, so its intermediates are memory-planned too (the reference
backend's fast path).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node

# Runs a partition: reads `inputs` (subgraph.inputs order) and writes every array in `outputs`
# (subgraph.outputs order) in place. The arrays are the runtime's; a backend never keeps them.
PartitionRun = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]
# Binds one node to fixed arrays (value name -> array, constants included) and returns a call with no
# arguments that computes the node's outputs into those arrays.
NodeBinder = Callable[[Node, Mapping[str, np.ndarray]], Callable[[], None]]


@dataclass(frozen=True)
class OpSupport:
    """What a backend accepts for one op, as data. None means no constraint."""

    dtypes: frozenset[DType] | None = None  # every input and output must have one of these
    max_rank: int | None = None  # every input and output rank at most this
    check: Callable[[Node, Graph], bool] | None = None  # anything a table cannot say (attrs, shapes)


@dataclass(frozen=True)
class Throughput:
    """What turns work into seconds on a backend. Defaults describe a plain CPU running numpy."""

    flops_per_s: float = 5e9
    bytes_per_s: float = 5e9
    dispatch_s: float = 2e-6  # fixed cost of launching one kernel
    transfer_bytes_per_s: float = math.inf  # into and out of the backend's memory (inf: host memory)
    transfer_latency_s: float = 0.0


@dataclass(frozen=True)
class OpCost:
    """Work of one node on one backend. `seconds` is a roofline: compute or memory, whichever binds."""

    flops: float  # elementary operations (a multiply-add counts 2)
    bytes_moved: float  # bytes read and written
    dispatch_s: float  # fixed per-launch cost

    def seconds(self, throughput: Throughput) -> float:
        return max(self.flops / throughput.flops_per_s, self.bytes_moved / throughput.bytes_per_s) \
            + self.dispatch_s


@dataclass
class CompiledPartition:
    """A subgraph a backend has made executable. Exactly what the runtime needs and nothing more."""

    backend: str
    graph: Graph  # the subgraph it was compiled from (inputs, outputs, nodes, constants)
    run: PartitionRun
    bind_node: NodeBinder | None = None  # offered by backends whose nodes run on the runtime's arena
    info: dict[str, object] = field(default_factory=dict)  # backend-specific notes for `edgerun plan`
    # False for a delegate whose `run` does no numpy arithmetic: a program made only of such partitions
    # runs without entering np.errstate (about 1 us per call, a third of a tiny model's call).
    uses_numpy_math: bool = True

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run standalone: allocate the outputs and return them (the runtime passes arena views instead)."""
        outs = [np.empty(self.graph.specs[o].shape, self.graph.specs[o].dtype.np) for o in self.graph.outputs]
        self.run(list(inputs), outs)
        return outs


class Backend(ABC):
    """Subclasses set `name`, `supported` (op -> OpSupport) and implement `compile`."""

    name: ClassVar[str] = ""
    extra: ClassVar[str | None] = None  # the `pip install edgerun[extra]` that provides its dependencies
    supported: ClassVar[Mapping[str, OpSupport]] = {}
    throughput: Throughput = Throughput()

    def supports(self, node: Node, graph: Graph) -> bool:
        rule = self.supported.get(node.op)
        if rule is None:
            return False
        specs = [graph.specs[v] for v in (*node.inputs, *node.outputs) if v]
        if rule.dtypes is not None and any(s.dtype not in rule.dtypes for s in specs):
            return False
        if rule.max_rank is not None and any(s.rank > rule.max_rank for s in specs):
            return False
        return rule.check is None or rule.check(node, graph)

    def cost(self, node: Node, graph: Graph) -> OpCost:
        flops, moved = node_work(node, graph)
        return OpCost(flops, moved, self.throughput.dispatch_s)

    def estimate_seconds(self, node: Node, graph: Graph) -> float:
        return self.cost(node, graph).seconds(self.throughput)

    def transfer_cost(self, nbytes: int) -> float:
        """Seconds to move `nbytes` between host memory and this backend (each way)."""
        t = self.throughput
        return t.transfer_latency_s + (nbytes / t.transfer_bytes_per_s if nbytes else 0.0)

    @abstractmethod
    def compile(self, subgraph: Graph) -> CompiledPartition:
        """Make `subgraph` executable. Raise anything on failure: the runtime falls back to reference."""

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


# ---- work counting: shared by every backend's default cost ---------------------------------------------

_TRANSCENDENTAL = {"exp", "log", "tanh", "sigmoid", "erf", "sin", "cos", "pow", "rsqrt", "sqrt"}
_TRANSCENDENTAL_FLOPS = 8  # a polynomial evaluation, roughly; only the ratio to a multiply-add matters


def node_work(node: Node, graph: Graph) -> tuple[float, float]:
    """(elementary operations, bytes read + written) of one atomic node or raster."""
    ins = [graph.specs[v] for v in node.inputs if v]
    outs = [graph.specs[v] for v in node.outputs]
    out_elems = sum(s.numel for s in outs)
    moved = float(sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs))
    op = node.op
    if op == "raster":
        copied = sum(int(r[9]) * int(r[10]) * int(r[11]) for r in node.attrs.get("regions", []))
        item = outs[0].dtype.itemsize
        return 0.0, float(2 * copied * item + (outs[0].nbytes if node.attrs.get("fill") is not None else 0))
    if op in ("matmul", "matmul_integer", "matmul_int4"):  # the integer and int4 forms do the same products
        return 2.0 * out_elems * ins[0].shape[-1], moved
    if op in ("conv2d", "conv_integer"):
        w = ins[1].shape  # O, I/groups, KH, KW
        return 2.0 * out_elems * w[1] * w[2] * w[3], moved
    if op in ("max_pool2d", "avg_pool2d"):
        kernel = node.attrs.get("kernel", 1)
        k = kernel * kernel if isinstance(kernel, int) else math.prod(kernel)
        return float(out_elems * k), moved
    if op.startswith("reduce_") or op in ("argmax", "argmin"):
        return float(ins[0].numel), moved
    per = _TRANSCENDENTAL_FLOPS if op in _TRANSCENDENTAL else 1
    return float(out_elems * per), moved
