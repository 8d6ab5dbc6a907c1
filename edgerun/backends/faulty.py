"""A TEST backend: the reference backend with one deliberate, realistic bug. Never use it to run models.

It exists to prove that the developer tools (carve, check, migrate, inspect, reduce) find and localise the
kinds of bug a new backend really has. Each bug is one op's kernel going wrong in a way seen on real
platforms; every other op is the reference's own kernel, bit for bit. Choose the bug with
`FaultyBackend(bug)`, with `edgerun.devtools.backend_from_spec("faulty:<bug>")` (the CLI's
`--backend faulty:<bug>`), or, for `get_backend("faulty")` in another process, the environment variable
EDGERUN_FAULT. With no bug it is a faithful copy of the reference.

Bugs (BUGS): what goes wrong, and for which inputs.
- tanh_nan: fast-math tanh as (e^2x - 1)/(e^2x + 1) in float32; e^2x overflows to inf above x ~ 44.4 and
  inf/inf is NaN. Correct for every |x| below that.
- dequant_uint8: int8 -> float cast (dequantisation) converts through uint8, so negative codes come out
  256 too large.
- fp16_reduce: sum/mean reductions longer than 1024 elements take a "long row" path that accumulates
  sequentially in float16.
- raster_stride: the raster kernel uses stride+1 on the outermost non-unit-stride axis of a region's
  source (reads are clamped into the source, so it is wrong, never unsafe).
- exp_range: fast exp as 2^n * 2^f with n = int32(floor(x log2 e)) put straight into the exponent bits,
  with no underflow guard: below x ~ -87.3 the exponent wraps (exp(-100) ~ 2.6e33, exp(-3.4e38) = 1.0 since
  the conversion saturates to INT_MIN) and exp(-inf) is NaN. The inputs that reach it are large negative
  numbers: the padding masks of attention (-1e9, finfo.min, -inf).
- sigmoid_range: a piecewise fast sigmoid whose outer segment (|x| > 8) is the wrong curve.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from edgerun.backends.base import Backend, CompiledPartition, OpSupport
from edgerun.backends.reference import bind_node as reference_bind_node
from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph, Node
from edgerun.ir.region import regions_of
from edgerun.oracle import KERNELS, Kernel, run_partition

Attrs = dict[str, Any]
LONG_REDUCTION = 1024
SIGMOID_RANGE = 8.0
EXP_UNDERFLOW = -87.33  # ln of float32's smallest normal


def _tanh_fast(ins: list[np.ndarray], attrs: Attrs, outs: list[np.ndarray]) -> None:
    x = ins[0]
    with np.errstate(all="ignore"):
        e = np.exp(np.float32(2) * x, dtype=x.dtype)
        outs[0][...] = (e - 1) / (e + 1)


def _cast_via_uint8(ins: list[np.ndarray], attrs: Attrs, outs: list[np.ndarray]) -> None:
    outs[0][...] = ins[0].astype(np.uint8).astype(outs[0].dtype)


def _reduce_fp16(mean: bool) -> Kernel:
    def run(ins: list[np.ndarray], attrs: Attrs, outs: list[np.ndarray]) -> None:
        x = ins[0]
        axes = tuple(range(x.ndim)) if attrs.get("axes") is None else \
            tuple(int(a) % max(x.ndim, 1) for a in attrs["axes"])
        keep = [a for a in range(x.ndim) if a not in axes]
        rows = np.transpose(x, keep + list(axes)).reshape(*[x.shape[a] for a in keep], -1)
        with np.errstate(all="ignore"):
            acc = np.cumsum(rows.astype(np.float16), axis=-1, dtype=np.float16)[..., -1].astype(np.float32)
            if mean:
                acc = acc / np.float32(rows.shape[-1])
        outs[0][...] = acc.reshape(outs[0].shape)
    return run


def _raster_off_by_one(ins: list[np.ndarray], attrs: Attrs, outs: list[np.ndarray]) -> None:
    flat_out = outs[0].reshape(-1)
    if attrs.get("fill") is not None:
        flat_out[...] = attrs["fill"]
    flats = [np.ascontiguousarray(x).reshape(-1) for x in ins]
    for r in regions_of(attrs):
        if r.numel == 0:
            continue
        strides = list(r.src_strides)
        for axis, (n, s) in enumerate(zip(r.size, strides)):
            if n > 1 and abs(s) > 1:
                strides[axis] = s + 1
                break
        wrong = replace(r, src_strides=(strides[0], strides[1], strides[2]))
        dst, src_idx = wrong.index_grids()
        flat_out[dst] = flats[r.src][np.clip(src_idx, 0, flats[r.src].size - 1)]


def _exp_wrapping(ins: list[np.ndarray], attrs: Attrs, outs: list[np.ndarray]) -> None:
    x = ins[0]
    KERNELS["exp"](ins, attrs, outs)
    low = ~(x >= EXP_UNDERFLOW)  # NaN inputs too
    if low.any():
        with np.errstate(all="ignore"):
            t = x[low].astype(np.float64) * np.log2(np.e)
            # float -> int32 as x86 converts it: out of range gives INT_MIN; then the 8-bit exponent wraps.
            in_range = t >= -(2.0**31)
            n = np.where(in_range, np.floor(t), -(2.0**31))
            frac = np.where(in_range, t - n, 0.0)
            val = np.exp2(np.mod(n + 127, 256) - 127) * np.exp2(frac)
            outs[0][low] = np.where(np.isfinite(t), val, np.nan).astype(x.dtype)


def _sigmoid_piecewise(ins: list[np.ndarray], attrs: Attrs, outs: list[np.ndarray]) -> None:
    x = ins[0]
    KERNELS["sigmoid"](ins, attrs, outs)
    outer = np.abs(x) > SIGMOID_RANGE
    if outer.any():
        outs[0][outer] = (0.5 + 0.5 * x[outer] / (1 + np.abs(x[outer]))).astype(x.dtype)


def _long_reduction(node: Node, graph: Graph) -> bool:
    spec = graph.specs[node.inputs[0]]
    axes = node.attrs.get("axes")
    n = spec.numel if axes is None else int(np.prod([spec.shape[int(a)] for a in axes]))
    return spec.dtype.is_float and n > LONG_REDUCTION


# bug -> (op -> (does this node take the faulty path?, faulty kernel))
Trigger = Callable[[Node, Graph], bool]
BUGS: dict[str, dict[str, tuple[Trigger, Kernel]]] = {
    "none": {},
    "tanh_nan": {"tanh": (lambda n, g: g.specs[n.inputs[0]].dtype.value == "float32", _tanh_fast)},
    "dequant_uint8": {"cast": (lambda n, g: g.specs[n.inputs[0]].dtype.value == "int8"
                               and g.specs[n.outputs[0]].dtype.is_float, _cast_via_uint8)},
    "fp16_reduce": {"reduce_sum": (_long_reduction, _reduce_fp16(False)),
                    "reduce_mean": (_long_reduction, _reduce_fp16(True))},
    "raster_stride": {"raster": (lambda n, g: True, _raster_off_by_one)},
    "exp_range": {"exp": (lambda n, g: g.specs[n.inputs[0]].dtype.value == "float32", _exp_wrapping)},
    "sigmoid_range": {"sigmoid": (lambda n, g: True, _sigmoid_piecewise)},
}


class FaultyBackend(Backend):
    """The reference with bug `bug` (see BUGS) injected; a test backend."""

    name = "faulty"
    supported = {op: OpSupport() for op in KERNELS}
    runs_decomposed = True

    def __init__(self, bug: str = "none") -> None:
        if bug not in BUGS:
            raise EdgerunError(f"unknown fault {bug!r}; choose one of {', '.join(BUGS)}")
        self.bug = bug

    def faulty_kernel(self, node: Node, graph: Graph) -> Kernel | None:
        """The injected kernel when `node` takes the buggy path, else None."""
        entry = BUGS[self.bug].get(node.op)
        return entry[1] if entry is not None and entry[0](node, graph) else None

    def compile(self, subgraph: Graph) -> CompiledPartition:
        kernels = {n.name: self.faulty_kernel(n, subgraph) for n in subgraph.nodes}

        def bind(node: Node, arrays: Mapping[str, np.ndarray]) -> Callable[[], None]:
            kernel = kernels.get(node.name)
            if kernel is None:
                return reference_bind_node(node, arrays)
            return functools.partial(kernel, [arrays[i] for i in node.inputs if i], node.attrs,
                                     [arrays[o] for o in node.outputs])

        run = functools.partial(run_partition, subgraph, kernel_for=lambda node: kernels.get(node.name))
        return CompiledPartition(self.name, subgraph, run, bind, info={"fault": self.bug})

    def __repr__(self) -> str:
        return f"<backend faulty:{self.bug}>"


def create_backend() -> FaultyBackend:
    return FaultyBackend(os.environ.get("EDGERUN_FAULT", "none"))
