"""The reference backend: the oracle (edgerun.oracle) as a backend, and the fallback of every placement.

A thin adapter. Its compiled partitions offer `bind_node`, so the runtime plans all their values in its
arena and runs each node as one pre-bound call. Binding is where the speed comes from: the common
elementwise ops become a direct ufunc call with its output array given positionally, and a raster's
strided source and destination views are built once, at load, instead of on every call. Everything else
calls the oracle's kernel with its arrays fixed. Both routes compute exactly what the oracle computes (the
tests compare them). The runtime runs the whole instruction list under `np.errstate(all="ignore")`, which
is what the kernels do per call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from edgerun.backends.base import AlgorithmChoice, Backend, CompiledPartition, OpSupport, Throughput
from edgerun.errors import UnsupportedOpError
from edgerun.ir.graph import Graph, Node
from edgerun.oracle import KERNELS, run_partition
from edgerun.oracle.conv_algorithms import CONV_ALGORITHMS, ConvShape, chosen_conv_kernel
from edgerun.oracle.kernels import raster_views

BoundCall = Callable[[], None]

# Ops whose kernel is exactly `ufunc(inputs..., out)` for every dtype the IR allows them.
_UFUNC_ANY_DTYPE: dict[str, np.ufunc] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "maximum": np.maximum, "minimum": np.minimum,
    "logical_and": np.logical_and, "logical_or": np.logical_or, "logical_xor": np.logical_xor,
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "neg": np.negative, "abs": np.absolute, "sign": np.sign,
    "logical_not": np.logical_not, "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh,
    "sin": np.sin, "cos": np.cos, "floor": np.floor, "ceil": np.ceil, "round": np.rint,
}
# Ops whose integer versions check for errors (division by zero, negative powers): float inputs only.
_UFUNC_FLOAT_ONLY: dict[str, np.ufunc] = {"pow": np.power, "reciprocal": np.reciprocal}


class ReferenceBackend(Backend):
    name = "reference"
    supported = {op: OpSupport() for op in KERNELS}
    holds_strings = True  # string ops' kernels are the reference's alone (oracle/string_kernels.py)
    # Integer products run as float64 BLAS (exact below 2^53): about half the float32 rate.
    throughput = Throughput(flops_per_s=1e10, bytes_per_s=4e9, dispatch_s=1.5e-6, integer_flops_per_s=5e9)
    # numpy's OpenBLAS threads spin for about 0.1 s after a GEMM or conv: ORT's SqueezeNet ran 6.0 ms
    # instead of 4.6 for 110 ms after five 512x512 GEMMs (2-core box).
    busy_after_call_s = 0.12
    runs_decomposed = True  # every composite, through its decomposition (the runtime lowers it after placement)
    # In the runtime its bodies load as programs of their own (runtime/control_flow.py); standalone
    # (run_partition) the oracle walks them. A cond's left-out branch is the oracle's clear error when taken.
    control_flow = {op: OpSupport() for op in ("cond", "while_loop", "scan")}

    def algorithm_choices(self, node: Node, graph: Graph) -> Sequence[AlgorithmChoice]:
        if node.op != "conv2d":
            return ()
        shape = ConvShape.of(node, graph)
        return [AlgorithmChoice(a.name, a.work(shape)) for a in CONV_ALGORITHMS if a.applies(shape)]

    def compile(self, subgraph: Graph) -> CompiledPartition:
        return self.compile_with_algorithms(subgraph, {})

    def compile_with_algorithms(self, subgraph: Graph, algorithms: Mapping[str, str]) -> CompiledPartition:
        for node in subgraph.nodes:
            if node.op not in KERNELS and node.op not in self.control_flow:
                raise UnsupportedOpError(node.op, module_path=node.meta.get("module_path"),
                                         detail="no reference kernel (composite ops must be decomposed first)")
        binder = functools.partial(bind_node, algorithms=dict(algorithms)) if algorithms else bind_node
        # update_slice's kernel writes only the new rows when handed its first input's array as its output
        # (a KV cache's step): declared, so a state it updates is planned in place.
        overwrites = {n.outputs[0]: n.inputs[0] for n in subgraph.nodes if n.op == "update_slice"}
        return CompiledPartition(self.name, subgraph, functools.partial(run_partition, subgraph), binder,
                                 overwrites_inputs=overwrites)


def create_backend() -> ReferenceBackend:
    return ReferenceBackend()


def bind_node(node: Node, arrays: Mapping[str, np.ndarray], algorithms: Mapping[str, str] | None = None) -> BoundCall:
    """A call with no arguments computing `node` from and into the fixed `arrays` (name -> array).

    `algorithms` maps node names to the conv algorithm the search chose (conv_algorithms.CONV_ALGORITHMS).
    A control-flow node is bound by the runtime (runtime/control_flow.py), which loads its bodies.
    """
    ins = [arrays[i] for i in node.inputs if i]
    outs = [arrays[o] for o in node.outputs]
    op = node.op
    ufunc = _UFUNC_ANY_DTYPE.get(op)
    if ufunc is None and all(a.dtype.kind == "f" for a in ins):
        ufunc = _UFUNC_FLOAT_ONLY.get(op)
        if op == "div" and node.attrs.get("rounding", "none") == "none":
            ufunc = np.true_divide
        if op == "mod":
            ufunc = np.fmod if node.attrs.get("fmod") else np.remainder
    if ufunc is not None:
        if ufunc is np.maximum or ufunc is np.minimum:  # numpy deprecates a positional out for these two
            return functools.partial(ufunc, *ins, out=outs[0])
        return functools.partial(ufunc, *ins, outs[0])
    if op == "rsqrt":
        return functools.partial(_rsqrt, ins[0], outs[0])
    if op == "matmul":
        return functools.partial(np.matmul, ins[0], ins[1], outs[0])
    if op == "raster":
        return _bind_raster(ins, node.attrs, outs[0])
    if op == "conv2d" and algorithms and (chosen := chosen_conv_kernel(algorithms.get(node.name), node, ins,
                                                                         outs[0])) is not None:
        return functools.partial(chosen, ins, node.attrs, outs)  # the search's algorithm choice
    kernel = KERNELS.get(op)
    if kernel is None:
        raise UnsupportedOpError(op, detail="no reference kernel")
    return functools.partial(kernel, ins, node.attrs, outs)


def _rsqrt(x: np.ndarray, out: np.ndarray) -> None:
    np.sqrt(x, out)
    np.divide(1, out, out)


def _bind_raster(ins: list[np.ndarray], attrs: Mapping[str, object], out: np.ndarray) -> BoundCall:
    flat_out = out.reshape(-1)
    pairs = raster_views(ins, attrs["regions"], out)
    fill = attrs.get("fill")
    if fill is None and len(pairs) == 1:
        return functools.partial(np.copyto, *pairs[0])
    return functools.partial(_raster_copy, flat_out, fill, pairs)


def _raster_copy(flat_out: np.ndarray, fill: object, pairs: list[tuple[np.ndarray, np.ndarray]]) -> None:
    if fill is not None:
        flat_out.fill(fill)  # type: ignore[arg-type]
    for dst, src in pairs:
        np.copyto(dst, src)
