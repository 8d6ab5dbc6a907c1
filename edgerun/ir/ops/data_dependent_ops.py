"""Ops whose output extent depends on the values they read: nonzero, unique, top_k_dynamic,
non_max_suppression.

Every other op's output shape follows from its inputs' shapes, so a template binds all its symbols from the
call's input shapes before anything runs. These cannot: how many elements are non-zero is known only once
the node has run. Each such node names a fresh symbol in attr `extent` (its output's data-dependent size),
declared in `Graph.symbols` with bounds [0, the most its input can give] (nonzero: the input's element
count). The rest of the graph computes with that symbol like any other. At run time the program is split
at such nodes (ir/staging.py): the stage before runs, the node runs on its reference kernel, and its
outputs' shapes bind the symbol for the stage after, which is then specialised like any template.
"""

from __future__ import annotations

from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.ops._rules import norm_axis
from edgerun.ir.registry import OpDef, OpKind, register, register_no_gradient
from edgerun.ir.symbolic import Dim, is_symbolic, sym
from edgerun.ir.tensor_spec import TensorSpec

Attrs = dict[str, Any]


def extent(attrs: Attrs) -> Dim:
    """The node's data-dependent size: the symbol its attr `extent` names."""
    name = attrs.get("extent")
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a data-dependent op needs attr 'extent' naming its output size's symbol, got {name!r}")
    return sym(name)


def _nonzero_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    if x.rank == 0:
        raise ValueError("nonzero of a 0-d tensor (give it rank 1)")
    return [TensorSpec((x.rank, extent(attrs)), DType.int64)]


def _unique_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    axis = attrs.get("axis")
    n = extent(attrs)
    if axis is None:
        y: tuple[Dim, ...] = (n,)
        inverse: Dim = x.numel
    else:
        axis = norm_axis(int(axis), x.rank)
        y = (*x.shape[:axis], n, *x.shape[axis + 1:])
        inverse = x.shape[axis]
    return [TensorSpec(y, x.dtype), TensorSpec((n,), DType.int64), TensorSpec((inverse,), DType.int64),
            TensorSpec((n,), DType.int64)]


def _nms_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    boxes, scores = ins[0], ins[1]
    if boxes.rank != 3 or scores.rank != 3 or boxes.shape[2] not in (4, *([boxes.shape[2]] if is_symbolic(
            boxes.shape[2]) else [])):  # a symbolic coordinate axis is checked by the kernel at run time
        raise ValueError(f"non_max_suppression takes boxes [batch, boxes, 4] and scores [batch, classes, boxes], "
                         f"got {boxes} and {scores}")
    if not boxes.dtype.is_float or scores.dtype != boxes.dtype:
        raise ValueError(f"non_max_suppression boxes and scores must share one float type, got {boxes}, {scores}")
    return [TensorSpec((extent(attrs), 3), DType.int64)]


def _top_k_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x, k = ins
    if x.rank == 0 or k.dtype is not DType.int64 or k.rank > 1:
        raise ValueError(f"top_k takes a tensor and an int64 k of one element, got {x} and {k}")
    axis = norm_axis(int(attrs.get("axis", -1)), x.rank)
    shape = (*x.shape[:axis], extent(attrs), *x.shape[axis + 1:])
    return [TensorSpec(shape, x.dtype), TensorSpec(shape, DType.int64)]


register(OpDef("nonzero", OpKind.DATA_DEPENDENT, _nonzero_rule, 1, 1,
               doc="indices of the non-zero elements, int64 [rank, extent] in row-major order (attr extent: the "
                   "count's symbol); masks, Compress, boolean indexing"))
register(OpDef("unique", OpKind.DATA_DEPENDENT, _unique_rule, 1, 1,
               doc="distinct elements or slices along attr axis (None: flattened), sorted or in order of first "
                   "occurrence (attr sorted); outputs: values, first indices, inverse indices, counts"))
register(OpDef("top_k_dynamic", OpKind.DATA_DEPENDENT, _top_k_rule, 2, 2,
               doc="the k largest (attr largest) values along attr axis and their indices, k a value computed at "
                   "run time (ties: lower index first); a k known at import is TopK's static decomposition"))
register(OpDef("non_max_suppression", OpKind.DATA_DEPENDENT, _nms_rule, 2, 5,
               doc="greedy per-class box selection by IoU (ONNX NonMaxSuppression; inputs boxes, scores, max "
                   "per class, IoU and score thresholds; attr center_point_box): [extent, 3] indices"))
register_no_gradient(["nonzero", "unique", "top_k_dynamic", "non_max_suppression"],
                     "its output size and indices depend on the data (integer results)")
