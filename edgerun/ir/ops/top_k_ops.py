"""`top_k`: the k largest (or smallest) values along an axis and their indices, k known at export.

A composite so that a template keeps it until its shapes are concrete: the decomposition builds tables the
size of the axis (the ranking below), which a symbolic axis cannot give; a backend with a TopK kernel could
claim it whole (none does yet). Decomposed, each element's rank is how many elements beat it (ties:
lower index first, as ONNX; with attr `nan_largest`, NaN ranks above every number as in torch's sort and
topk); ranks form a permutation, so output slot r picks the one element of rank r
with a masked sum, which is exact. The pairwise comparison costs n^2 per row: longer axes are refused
rather than made slow silently (at import when static, at specialisation when symbolic). A k computed at
run time is `top_k_dynamic` (data_dependent_ops.py).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgerun.errors import UnsupportedOpError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.ops._rules import norm_axis
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.symbolic import is_symbolic
from edgerun.ir.tensor_spec import TensorSpec

Attrs = dict[str, Any]
MAX_PAIRWISE_ELEMENTS = 1 << 24  # the ranking's comparison tensor; beyond it top_k is refused, not made slow


def _rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    if x.rank == 0:
        raise ValueError("top_k of a 0-d tensor")
    axis = norm_axis(int(attrs.get("axis", -1)), x.rank)
    k, n = int(attrs["k"]), x.shape[axis]
    if k < 0 or (not is_symbolic(n) and k > n):
        raise ValueError(f"top_k k={k} outside [0, {n}]")
    shape = (*x.shape[:axis], k, *x.shape[axis + 1:])
    return [TensorSpec(shape, x.dtype), TensorSpec(shape, DType.int64)]


def _decompose(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x = ins[0]
    shape = b.shape(x)
    rank = len(shape)
    axis = norm_axis(int(attrs.get("axis", -1)), rank)
    k, n = int(attrs["k"]), int(shape[axis])
    if k > n:
        raise ValueError(f"top_k k={k} outside [0, {n}]")
    outer = math.prod(int(d) for d in shape) // max(n, 1)
    if outer * n * n > MAX_PAIRWISE_ELEMENTS:  # a template's shape: checked once it is concrete
        raise UnsupportedOpError("top_k", detail=f"over an axis of {n} (pairwise ranking would need "
                                 f"{outer * n * n} elements, more than {MAX_PAIRWISE_ELEMENTS})")
    largest = bool(attrs.get("largest", True))
    perm = [d for d in range(rank) if d != axis] + [axis]
    xt = b.emit("transpose", [x], perm=perm)
    lead = [shape[d] for d in perm[:-1]]
    xi = b.emit("reshape", [xt], shape=[*lead, n, 1])
    xj = b.emit("reshape", [xt], shape=[*lead, 1, n])
    beats = b.emit("gt" if largest else "lt", [xj, xi])
    ties = b.emit("eq", [xj, xi])
    if attrs.get("nan_largest") and b.dtype(x).is_float:  # torch's order: NaN above every number, NaNs tie
        nan_i, nan_j = b.emit("ne", [xi, xi]), b.emit("ne", [xj, xj])
        above = [nan_j, b.emit("logical_not", [nan_i])] if largest else [nan_i, b.emit("logical_not", [nan_j])]
        beats = b.emit("logical_or", [beats, b.emit("logical_and", above)])
        ties = b.emit("logical_or", [ties, b.emit("logical_and", [nan_i, nan_j])])
    earlier = b.const(np.arange(n)[None, :] < np.arange(n)[:, None])  # [i, j]: j < i
    wins = b.emit("logical_or", [beats, b.emit("logical_and", [ties, earlier])])
    ranks = b.emit("reduce_sum", [b.emit("cast", [wins], dtype="int64")], axes=[rank], keepdims=False)
    slots = b.const(np.arange(k, dtype=np.int64).reshape(k, 1))
    pick = b.emit("eq", [b.emit("reshape", [ranks], shape=[*lead, 1, n]), slots])  # [..., k, n]
    values = b.emit("reduce_sum", [b.emit("where", [pick, b.emit("reshape", [xt], shape=[*lead, 1, n]),
                                                    b.scalar(0, x)])], axes=[rank], keepdims=False)
    iota = b.const(np.arange(n, dtype=np.int64))
    index = b.emit("reduce_sum", [b.emit("where", [pick, iota, b.const(np.int64(0))])], axes=[rank],
                   keepdims=False)
    back = [perm.index(d) for d in range(rank)]
    return [b.emit("transpose", [values], perm=back), b.emit("transpose", [index], perm=back)]


register(OpDef("top_k", OpKind.COMPOSITE, _rule, 1, 1, decompose=_decompose,
               doc="the k largest (attr largest) values along attr axis and their indices, k an attr (ties: lower "
                   "index first); kept whole until shapes are concrete, then pairwise ranks and masked sums"))
