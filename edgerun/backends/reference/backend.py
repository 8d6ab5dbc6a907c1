"""The reference backend: every atomic op and raster, in numpy. The oracle, and the fallback of every placement.

Its compiled partitions offer `bind_node`, so the runtime plans all their values in its arena and runs each
node as one pre-bound call. Binding is where the speed comes from: the common elementwise ops become a
direct ufunc call with its output array given positionally, and a raster's strided source and destination
views are built once, at load, instead of on every call. Everything else calls the kernel in kernels.py
with its arrays fixed. Both routes compute exactly what kernels.py computes (the tests compare them).
The runtime runs the whole instruction list under `np.errstate(all="ignore")`, which is what the kernels
in kernels.py do per call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from edgerun.backends.base import Backend, CompiledPartition, OpSupport, Throughput
from edgerun.backends.reference.algorithms import chosen_conv_kernel
from edgerun.backends.reference.kernels import KERNELS, raster_views
from edgerun.errors import UnsupportedOpError
from edgerun.ir.graph import Graph, Node

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
    throughput = Throughput(flops_per_s=1e10, bytes_per_s=4e9, dispatch_s=1.5e-6)

    def compile(self, subgraph: Graph) -> CompiledPartition:
        for node in subgraph.nodes:
            if node.op not in KERNELS:
                raise UnsupportedOpError(node.op, module_path=node.meta.get("module_path"),
                                         detail="no reference kernel (composite ops must be decomposed first)")
        return CompiledPartition(self.name, subgraph, functools.partial(_run_unplanned, subgraph), bind_node)


def create_backend() -> ReferenceBackend:
    return ReferenceBackend()


def _run_unplanned(graph: Graph, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
    """The standalone path: fresh arrays per value (the runtime uses bind_node on its arena instead)."""
    env: dict[str, np.ndarray] = dict(graph.constants)
    env.update(zip(graph.inputs, inputs))
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            outs = [np.empty(graph.specs[o].shape, graph.specs[o].dtype.np) for o in node.outputs]
            KERNELS[node.op]([env[i] for i in node.inputs if i], node.attrs, outs)
            env.update(zip(node.outputs, outs))
    for name, dst in zip(graph.outputs, outputs):
        np.copyto(dst, env[name])


def bind_node(node: Node, arrays: Mapping[str, np.ndarray]) -> BoundCall:
    """A call with no arguments computing `node` from and into the fixed `arrays` (name -> array)."""
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
    if op == "conv2d" and (chosen := chosen_conv_kernel(node, ins, outs[0])) is not None:
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
