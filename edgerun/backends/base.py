"""The backend interface: what a backend can run, what it costs, and how it compiles a partition.

A backend is one module under edgerun/backends/ exposing `create_backend() -> Backend` (see registry.py).
The runtime asks each backend, per node, `supports(node, graph)`; the search asks what the class declares
(`cost`, `throughput`, `partition_overhead_s`, `fuses_activations`, `busy_after_call_s`,
`algorithm_choices`, `settings`, `tunable_settings`) and never probes for anything else; the partitioner hands each backend maximal subgraphs of the nodes placed on it and
calls `compile(subgraph)`. A compiled partition runs on arrays the runtime owns (views of its one arena):
either as one call per partition (a delegate: ONNX Runtime, a remote device), or, when the backend offers
`bind_node`, as one pre-bound call per node, so its intermediates are memory-planned too (the reference
backend's fast path).
"""

from __future__ import annotations

import copy
import json
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import ClassVar

import numpy as np

from edgerun.ir.decompose import decompose
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.region import copied_elements, regions_of
from edgerun.ir.registry import OpKind, get_op
from edgerun.ir.subgraphs import bodies_of, is_control_flow
from edgerun.oracle.conv_algorithms import Work

# Runs a partition: reads `inputs` (subgraph.inputs order) and writes every array in `outputs`
# (subgraph.outputs order) in place. The arrays are the runtime's; a backend never keeps them. It may be
# handed other arrays on a later call (of the same shapes and dtypes).
PartitionRun = Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]
# Binds one node to fixed arrays (value name -> array, constants included) and returns a call with no
# arguments that computes the node's outputs into those arrays. A bound raster with no fill writes only the
# bytes its regions cover (the runtime narrows a KV cache's write to its new rows on that: runtime/state.py).
NodeBinder = Callable[[Node, Mapping[str, np.ndarray]], Callable[[], None]]


class ResidentState:
    """A program state a compiled partition may keep in its own memory from one call to the next
    (`CompiledPartition.keep_state`): a GPU's KV cache then stays on the GPU instead of crossing to the host
    and back every call. `read` is the partition input that reads the state, `update` the output that holds
    its new value. The runtime's state store owns `host` and `holders` (state -> the holder with the newest
    value and how to copy it into the host buffer), shared by every handle of the store, so a value moves
    only when another partition (another method) or the host needs it."""

    def __init__(self, name: str, read: str, update: str, host: np.ndarray,
                 holders: dict[str, tuple[object, Callable[[np.ndarray], None]]]) -> None:
        self.name, self.read, self.update, self.host, self.holders = name, read, update, host, holders

    def acquire(self, holder: object, pull: Callable[[np.ndarray], None]) -> bool:
        """Called by `holder` before a call that reads the state: True when it must load `host` first (it
        does not hold the newest value; another holder's is copied into `host` then). From here on `holder`
        holds it, and the host's copy is stale until the runtime pulls it (`pull(host)`)."""
        current = self.holders.get(self.name)
        if current is not None and current[0] is holder:
            return False
        if current is not None:
            current[1](self.host)
        self.holders[self.name] = (holder, pull)
        return True

    def release(self, holder: object) -> None:
        """`holder` is about to lose its memory (reallocated): its value goes back to the host first."""
        current = self.holders.get(self.name)
        if current is not None and current[0] is holder:
            current[1](self.host)
            del self.holders[self.name]


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
    # Elementary operations per second of integer products (INTEGER_OPS: int8/uint8 operands, int32 sums),
    # which int8 kernels (VNNI, vpmaddubsw) run at up to 4x the float rate and numpy emulates at below it.
    # None: as `flops_per_s`.
    integer_flops_per_s: float | None = None

    @property
    def integer_rate(self) -> float:
        return self.flops_per_s if self.integer_flops_per_s is None else self.integer_flops_per_s


# Integer matrix products: costed at a backend's integer rate, not its float one.
INTEGER_OPS = frozenset({"conv_integer", "matmul_integer"})


@dataclass(frozen=True)
class AlgorithmChoice:
    """One way a backend can compute a node, and the work it does that way (the search costs each choice
    with the backend's measured rates and hands the cheapest to `compile_with_algorithms`)."""

    name: str
    work: Work


@dataclass(frozen=True)
class OpCost:
    """Work of one node on one backend. `seconds` is a roofline: compute or memory, whichever binds."""

    flops: float  # elementary operations (a multiply-add counts 2)
    bytes_moved: float  # bytes read and written
    dispatch_s: float  # fixed per-launch cost
    integer: bool = False  # integer products (INTEGER_OPS): at the integer rate

    def seconds(self, throughput: Throughput) -> float:
        rate = throughput.integer_rate if self.integer else throughput.flops_per_s
        return max(self.flops / rate, self.bytes_moved / throughput.bytes_per_s) + self.dispatch_s


@dataclass
class CompiledPartition:
    """A subgraph a backend has made executable. Exactly what the runtime needs and nothing more.

    `run` is the partition's whole behaviour at call time: it reads the input arrays and writes the output
    arrays it is handed, and anything else it needs it does itself. A `run` that computes with numpy quiets
    floating-point warnings itself (overflow to inf, 0/0 to NaN are the kernels' business, as the oracle's
    kernels do); the runtime enters `np.errstate` only around the node calls it binds (`bind_node`), so a
    program made of delegates alone runs without it.

    `release` is the third step of the contract (compile, run, release): it frees what compile made (a
    session, a converted model in the backend's memory) at once, rather than whenever the last reference to
    the partition goes; the partition is not run after it. The runtime calls it from
    `LoadedProgram.release` (the load-time search does, for every candidate that lost). A backend with
    nothing of its own to free leaves the default, which does nothing.

    Beyond that, a partition may declare three capabilities, each general (any backend may declare it) and
    each with one runtime path: a state it keeps in its own memory (`keep_state`: runtime/state.py), outputs
    it writes over the input arrays they update (`overwrites_inputs`: runtime/state.py), and constants it
    no longer reads from the host (`released_constants`: runtime/constant_release.py). The default declares
    none of them, and a partition declaring none runs correctly everywhere.
    """

    backend: str
    graph: Graph  # the subgraph it was compiled from (inputs, outputs, nodes, constants)
    run: PartitionRun
    bind_node: NodeBinder | None = None  # offered by backends whose nodes run on the runtime's arena
    info: dict[str, object] = field(default_factory=dict)  # backend-specific notes for `edgerun plan`
    # State it keeps: given the states this partition alone reads and updates (ResidentState handles), it
    # returns the names of those it keeps between calls. For those, `run` neither reads the input array nor
    # writes the update's array; the runtime pulls the value only when the host needs it (docs/runtime.md,
    # "State a backend keeps in its own memory").
    keep_state: Callable[[Sequence[ResidentState]], Collection[str]] | None = None
    # Constants it releases: constants of `graph` it never reads from the host's arrays again once compiled
    # (the backend made its own layout of them, e.g. ONNX Runtime's prepacked weights). The runtime may drop
    # the host's copy of those that no other partition or method reads.
    released_constants: frozenset[str] = frozenset()
    # Inputs it overwrites: outputs it computes correctly when the runtime hands each one the very array of
    # the input it names (output -> input), writing only what changes into it (ONNX Runtime's
    # GroupQueryAttention appending a KV cache's new rows to past_key's buffer). An output that updates the
    # state this input reads is then planned into the state's buffer, as the reference's update_slice is:
    # no copy after the call.
    overwrites_inputs: Mapping[str, str] = field(default_factory=dict)
    release: Callable[[], None] = field(default=lambda: None)  # frees what compile made (see above)

    def __call__(self, *inputs: np.ndarray) -> list[np.ndarray]:
        """Run standalone: allocate the outputs and return them (the runtime passes arena views instead)."""
        outs = [np.empty(self.graph.specs[o].shape, self.graph.specs[o].dtype.np) for o in self.graph.outputs]
        self.run(list(inputs), outs)
        return outs


class Backend(ABC):
    """Subclasses set `name`, `supported` (op -> OpSupport) and implement `compile`."""

    name: ClassVar[str] = ""
    extra: ClassVar[str | None] = None  # the `pip install edgerun[extra]` that provides its dependencies
    # The distribution whose version changes this backend's speed: part of `identity()`, so calibrations
    # and tuned placements are measured again when it changes. None: edgerun and numpy alone.
    library: ClassVar[str | None] = None
    supported: ClassVar[Mapping[str, OpSupport]] = {}
    throughput: Throughput = Throughput()  # declared figures, until calibration measures this machine
    # Seconds one call of a compiled partition costs beyond its nodes (a delegate's session call), until
    # calibration measures it.
    partition_overhead_s: ClassVar[float] = 0.0
    # Folds an activation or bias add (max, min, add) into the conv or matmul before it, so the search
    # keeps such pairs together on this backend.
    fuses_activations: ClassVar[bool] = False
    # Seconds its worker threads keep cores busy after a call returns (a BLAS pool spinning while it waits
    # for more work): whatever runs next on the machine pays for it. The search lets that much time pass
    # before timing the next candidate placement (edgerun.search.timing).
    busy_after_call_s: ClassVar[float] = 0.0
    # Its partitions copy their inputs into memory of its own and their outputs back on every call, even
    # where the memory is the host's (MNN's tensors), and keep no reference to the arrays they are handed.
    # Calibration then splits a call's memory-bound time into work and those copies (its transfer rate), and
    # a program that is one such partition runs it on the caller's inputs and fresh outputs: the arena's
    # fixed arrays would only add a copy each way (LoadedProgram.run).
    copies_at_boundary: ClassVar[bool] = False

    # Composite ops this backend runs whole, as one kernel, with the same kind of constraints as `supported`
    # (ExecuTorch's ops_to_not_decompose). At load, a composite some candidate backend claims stays whole
    # until placement; wherever it lands on a backend that does not claim it, the runtime lowers it there.
    composites: ClassVar[Mapping[str, OpSupport]] = {}
    # Runs any composite through its decomposition (the runtime lowers it after placement): the reference.
    runs_decomposed: ClassVar[bool] = False
    # Control-flow ops (cond, while_loop, scan) this backend runs whole, bodies included, with the same kind
    # of constraints as `supported`: it gets such a node only when it also supports every node of every body
    # (at any depth), so a body never needs a second backend. The partitioner hands it the node with its
    # bodies (the partition graph's `subgraphs`).
    control_flow: ClassVar[Mapping[str, OpSupport]] = {}
    # Whether this backend takes nodes that read or write string tensors (DType.string: object arrays of str).
    # Only the reference does: a string element is a Python object, not bytes a device buffer or a delegate's
    # tensor could hold, so every other backend declines such a node whatever its tables say (a raster or a
    # reshape is declared for any dtype).
    holds_strings: ClassVar[bool] = False

    def supports(self, node: Node, graph: Graph) -> bool:
        if not self.holds_strings and any(graph.specs[v].dtype is DType.string for v in (*node.inputs, *node.outputs)
                                          if v):
            return False
        if is_control_flow(node.op):
            return _fits(self.control_flow.get(node.op), node, graph) and all(
                self.supports(inner, body) for body in bodies_of(node, graph)
                                                        for inner in body.nodes)
        if is_composite(node.op):
            return self.runs_decomposed or self.keeps_whole(node, graph)
        return _fits(self.supported.get(node.op), node, graph)

    def keeps_whole(self, node: Node, graph: Graph) -> bool:
        """Whether this backend runs composite `node` as one kernel (see `composites`)."""
        return _fits(self.composites.get(node.op), node, graph)

    def cost(self, node: Node, graph: Graph) -> OpCost:
        if is_composite(node.op):
            work = composite_work(node, graph)
            if self.keeps_whole(node, graph):
                return OpCost(work.flops, work.boundary_bytes, self.throughput.dispatch_s)
            return OpCost(work.flops, work.bytes_moved, self.throughput.dispatch_s * work.pieces)
        flops, moved = node_work(node, graph)
        return OpCost(flops, moved, self.throughput.dispatch_s, integer=node.op in INTEGER_OPS)

    def estimate_seconds(self, node: Node, graph: Graph) -> float:
        return self.cost(node, graph).seconds(self.throughput)

    def algorithm_choices(self, node: Node, graph: Graph) -> Sequence[AlgorithmChoice]:
        """The ways this backend can compute `node`, when it has a choice (none: it decides alone)."""
        return ()

    def settings(self) -> dict[str, object]:
        """The configuration this backend's speed depends on (thread count, ...): a change means measuring
        again, so it is part of the calibration cache's key."""
        return {}

    def tunable_settings(self) -> dict[str, tuple[object, ...]]:
        """Settings calibration may choose, each with the values to try (the current one first). Only
        settings the user left open belong here."""
        return {}

    def apply_settings(self, chosen: Mapping[str, object]) -> None:
        """Take these values of (some of) `tunable_settings`; called on a fresh copy only (with_settings)."""
        if chosen:
            raise ValueError(f"backend {self.name!r} has no tunable settings {sorted(chosen)}")

    def with_settings(self, chosen: Mapping[str, object]) -> Backend:
        """This backend with `chosen` applied to those of its settings still open (the user may have fixed
        one since it was chosen): a copy when anything changes, this instance never. A load builds with its
        own copy, so loads with different settings, in one thread or several, cannot see each other's."""
        open_now = self.tunable_settings()
        usable = {k: v for k, v in chosen.items() if k in open_now and open_now[k][0] != v}
        if not usable:
            return self
        other = copy.copy(self)
        other.apply_settings(usable)
        return other

    def transfer_cost(self, nbytes: int) -> float:
        """Seconds to move `nbytes` between host memory and this backend (each way)."""
        t = self.throughput
        return t.transfer_latency_s + (nbytes / t.transfer_bytes_per_s if nbytes else 0.0)

    @abstractmethod
    def compile(self, subgraph: Graph) -> CompiledPartition:
        """Make `subgraph` executable. Raise anything on failure: the runtime falls back to reference."""

    def compile_with_algorithms(self, subgraph: Graph, algorithms: Mapping[str, str]) -> CompiledPartition:
        """`compile`, binding the algorithm the search chose for some nodes (node name -> algorithm name,
        one of `algorithm_choices`). Only a backend that declares choices is ever called with some."""
        return self.compile(subgraph)

    def identity(self) -> str:
        """The name, with the version of `library` where there is one ("onnxruntime@1.22.0")."""
        if self.library is None:
            return self.name
        try:
            return f"{self.name}@{metadata.version(self.library)}"
        except metadata.PackageNotFoundError:
            return self.name

    def __repr__(self) -> str:
        return f"<backend {self.name}>"


def _fits(rule: OpSupport | None, node: Node, graph: Graph) -> bool:
    if rule is None:
        return False
    specs = [graph.specs[v] for v in (*node.inputs, *node.outputs) if v]
    if rule.dtypes is not None and any(s.dtype not in rule.dtypes for s in specs):
        return False
    if rule.max_rank is not None and any(s.rank > rule.max_rank for s in specs):
        return False
    return rule.check is None or rule.check(node, graph)


def is_composite(op: str) -> bool:
    return get_op(op).kind is OpKind.COMPOSITE


# ---- work counting: shared by every backend's default cost ---------------------------------------------


@dataclass(frozen=True)
class CompositeWork:
    """What a composite node does, counted over its decomposition."""

    flops: float
    bytes_moved: float  # every piece's reads and writes: the composite run decomposed
    boundary_bytes: float  # its own inputs and outputs: the composite run as one kernel
    pieces: int  # atomic nodes and rasters it lowers to


def composite_work(node: Node, graph: Graph) -> CompositeWork:
    """Work of a composite node, from its decomposition at these shapes (cached per op, attrs and specs)."""
    key = json.dumps([node.op, node.attrs, [str(graph.specs[v]) if v else "" for v in node.inputs]],
                     sort_keys=True, default=str)
    work = _COMPOSITE_WORK.get(key)
    if work is None:
        scratch = Graph()
        for v in dict.fromkeys(v for v in node.inputs if v):
            scratch.add_input(v, graph.specs[v])
        scratch.nodes.append(Node(node.op, list(node.inputs), list(node.outputs), dict(node.attrs), name="c"))
        scratch.specs.update({o: graph.specs[o] for o in node.outputs})
        scratch.outputs = list(node.outputs)
        try:
            decompose(scratch)
        except (ValueError, KeyError, RuntimeError):  # a decomposition that needs constant values: count it whole
            scratch.nodes = []
        counted = [node_work(n, scratch) for n in scratch.nodes]
        boundary = float(sum(graph.specs[v].nbytes for v in (*node.inputs, *node.outputs) if v))
        work = CompositeWork(sum(f for f, _ in counted), sum(b for _, b in counted), boundary, len(scratch.nodes))
        _COMPOSITE_WORK[key] = work
    return work


_COMPOSITE_WORK: dict[str, CompositeWork] = {}

_TRANSCENDENTAL = {"exp", "log", "tanh", "sigmoid", "erf", "sin", "cos", "pow", "rsqrt", "sqrt"}
_TRANSCENDENTAL_FLOPS = 8  # a polynomial evaluation, roughly; only the ratio to a multiply-add matters


def node_work(node: Node, graph: Graph) -> tuple[float, float]:
    """(elementary operations, bytes read + written) of one node (a composite: over its decomposition; control
    flow: the dearer cond branch, or one trip of a loop, whose count is known only at run time)."""
    if is_control_flow(node.op):
        per_body = [[node_work(n, body) for n in body.nodes] for body in bodies_of(node, graph)]
        steps = int(node.attrs.get("length", 1)) if node.op == "scan" and type(node.attrs.get("length")) is int else 1
        return (steps * max(sum(f for f, _ in w) for w in per_body),
                steps * max(sum(b for _, b in w) for w in per_body))
    if is_composite(node.op):
        work = composite_work(node, graph)
        return work.flops, work.bytes_moved
    ins = [graph.specs[v] for v in node.inputs if v]
    outs = [graph.specs[v] for v in node.outputs]
    out_elems = sum(s.numel for s in outs)
    moved = float(sum(s.nbytes for s in ins) + sum(s.nbytes for s in outs))
    op = node.op
    if op == "raster":
        copied = copied_elements(regions_of(node.attrs))
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
