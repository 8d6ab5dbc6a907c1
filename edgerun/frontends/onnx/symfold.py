"""Import-time folding of shape arithmetic over symbolic dimensions.

`Shape` of a value with symbolic dimensions is known at import time as an object array of ints and SymDims
(`[1, 3, H, W]`). The integer arithmetic exporters build on it (Gather, Slice, Concat, Unsqueeze, Squeeze,
Reshape, Cast to an integer type, Add/Sub/Mul/Div/Mod, Min/Max, Neg, comparisons, Where, ReduceProd/Sum) folds
here, element by element, so Reshape targets, Expand shapes, Slice bounds and Pad widths become symbolic
attributes. An op or operand this cannot fold (a comparison that depends on the symbols' run-time values, a
Cast to float) returns None: the importer then computes it at run time from the materialised dimensions (see
ImportContext.value), and a consumer that needs it at import time is refused naming its node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from edgerun.frontends.onnx.context import ONNX_TO_DTYPE, ImportContext, OnnxNode
from edgerun.ir.dtypes import DType
from edgerun.ir.symbolic import SymDim, fixed_by_bounds, floordiv, mod, sym_max, sym_min, value_range

Folder = Callable[[list[np.ndarray | None], OnnxNode, Mapping[str, tuple[int, int]]], list[np.ndarray] | None]


def is_symbolic(arr: np.ndarray | None) -> bool:
    """An import-time value holding SymDims (an object array)."""
    return arr is not None and arr.dtype == object


def dims_array(dims: Any, dtype: Any = np.int64) -> np.ndarray:
    """Sizes as an integer array, or an object array when any of them is symbolic."""
    values = np.asarray(dims, dtype=object)
    if any(isinstance(v, SymDim) for v in values.reshape(-1)):
        return values
    return np.asarray(values.tolist(), dtype=dtype).reshape(values.shape)


def fold_symbolic(ctx: ImportContext, node: OnnxNode) -> list[np.ndarray] | None:
    """Outputs of `node` when every input is known at import time and some are symbolic, else None."""
    folder = FOLDERS.get(node.op_type)
    if folder is None:
        return None
    inputs = [ctx.consts[i] if i else None for i in node.inputs]
    return folder(inputs, node, ctx.graph.symbols)


def _ints(arr: np.ndarray | None) -> list[int]:
    if arr is None or is_symbolic(arr):
        raise _Unfoldable
    return [int(v) for v in arr.reshape(-1)]


class _Unfoldable(Exception):
    """Raised inside a folder: this node cannot be folded symbolically (the importer computes it at run time)."""


def _guard(fn: Folder) -> Folder:
    def run(inputs: list[np.ndarray | None], node: OnnxNode,
            symbols: Mapping[str, tuple[int, int]]) -> list[np.ndarray] | None:
        try:
            results = fn(inputs, node, symbols)
        except _Unfoldable:
            return None
        assert results is not None
        # np.take of one index gives a bare SymDim; every output is an array again here.
        outs = [np.asarray(o, dtype=o.dtype if isinstance(o, np.ndarray) else object) for o in results]
        # A size the bounds fix is that number ((L + 15)//48 is 1 for L in 33..80): what follows is proved
        # with it over every size in the bounds, where the symbolic form would hold only at some sizes.
        outs = [np.asarray(np.frompyfunc(lambda d: fixed_by_bounds(d, symbols), 1, 1)(o), dtype=object)
                if o.dtype == object else o for o in outs]
        return [dims_array(o, o.dtype if o.dtype != object else np.int64) for o in outs]
    return run


FOLDERS: dict[str, Folder] = {}


def _folds(*ops: str) -> Callable[[Folder], Folder]:
    def deco(fn: Folder) -> Folder:
        for op in ops:
            FOLDERS[op] = _guard(fn)
        return fn
    return deco


# -- layout -----------------------------------------------------------------------------------------------------
@_folds("Identity")
def _identity(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    assert ins[0] is not None
    return [ins[0]]


@_folds("Gather")
def _gather(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    data, idx = ins[0], ins[1]
    assert data is not None
    if idx is None or is_symbolic(idx):
        raise _Unfoldable
    return [np.take(data, idx.astype(np.int64), axis=int(node.attr("axis", 0)))]


@_folds("Slice")
def _slice(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    data = ins[0]
    assert data is not None
    if node.version < 10:
        starts, ends, axes, steps = node.attr("starts"), node.attr("ends"), node.attr("axes"), None
    else:
        starts, ends = _ints(ins[1]), _ints(ins[2])
        axes = _ints(ins[3]) if len(ins) > 3 and ins[3] is not None else None
        steps = _ints(ins[4]) if len(ins) > 4 and ins[4] is not None else None
    axes = list(axes) if axes is not None else list(range(len(starts)))
    index = [slice(None)] * data.ndim
    for k, a in enumerate(axes):
        index[int(a) % data.ndim] = slice(int(starts[k]), int(ends[k]), int(steps[k]) if steps else 1)
    return [data[tuple(index)]]


@_folds("Concat")
def _concat(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    parts = [np.asarray(a, dtype=object) for a in ins if a is not None]
    return [np.concatenate(parts, axis=int(node.attr("axis")))]


def _axes(ins: list[np.ndarray | None], node: OnnxNode) -> list[int] | None:
    if node.version >= 13:
        return _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else None
    axes = node.attr("axes")
    return None if axes is None else [int(a) for a in axes]


@_folds("Unsqueeze")
def _unsqueeze(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    data = ins[0]
    assert data is not None
    axes = _axes(ins, node) or []
    rank = data.ndim + len(axes)
    out = data
    for a in sorted(a % rank for a in axes):
        out = np.expand_dims(out, a)
    return [out]


@_folds("Squeeze")
def _squeeze(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    data = ins[0]
    assert data is not None
    axes = _axes(ins, node)
    return [np.squeeze(data) if axes is None else np.squeeze(data, axis=tuple(a % data.ndim for a in axes))]


@_folds("Reshape")
def _reshape(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    data = ins[0]
    assert data is not None
    target = _ints(ins[1])
    if not node.attr("allowzero", 0):
        target = [data.shape[i] if t == 0 else t for i, t in enumerate(target)]
    return [data.reshape(target)]


@_folds("Flatten")
def _flatten(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    data = ins[0]
    assert data is not None
    axis = int(node.attr("axis", 1)) % max(data.ndim, 1) if data.ndim else 0
    return [data.reshape(int(np.prod(data.shape[:axis])), -1)]


@_folds("Cast", "CastLike")
def _cast(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    to = ONNX_TO_DTYPE.get(int(node.attr("to", 7))) if node.op_type == "Cast" else None
    if node.op_type == "CastLike":
        like = ins[1]
        to = DType.int64 if like is None or is_symbolic(like) else DType.of(like)
    if to not in (DType.int64, DType.int32):
        raise _Unfoldable  # a dimension as float or bool data is computed at run time
    assert ins[0] is not None
    return [ins[0]]


# -- arithmetic and logic -----------------------------------------------------------------------------------------
def _operands(ins: list[np.ndarray | None]) -> tuple[np.ndarray, np.ndarray]:
    a, b = ins[0], ins[1]
    assert a is not None and b is not None
    for x in (a, b):
        if not is_symbolic(x) and x.dtype.kind not in "iu":
            raise _Unfoldable  # float arithmetic on dimensions is data, not a shape
    return np.asarray(a, dtype=object), np.asarray(b, dtype=object)


def _div(a: Any, b: Any) -> Any:
    if isinstance(a, SymDim) or isinstance(b, SymDim):
        return floordiv(a, b)  # dimensions are non-negative, where truncating and floor division agree
    q = abs(int(a)) // abs(int(b))  # ONNX's integer Div truncates toward zero
    return q if (a >= 0) == (b > 0) else -q


_ARITH: dict[str, Callable[[Any, Any], Any]] = {
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b, "Mul": lambda a, b: a * b,
    "Div": _div, "Max": sym_max, "Min": sym_min,
}


@_folds("Add", "Sub", "Mul", "Div", "Max", "Min")
def _arith(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    present = [x for x in ins if x is not None]
    out = np.asarray(present[0], dtype=object)
    for other in present[1:]:
        a, b = _operands([out, other])
        out = np.frompyfunc(_ARITH[node.op_type], 2, 1)(a, b)
    return [np.asarray(out, dtype=object)]


@_folds("Mod")
def _mod(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    if node.attr("fmod", 0):
        raise _Unfoldable
    a, b = _operands(ins)
    return [np.asarray(np.frompyfunc(mod, 2, 1)(a, b), dtype=object)]


@_folds("Neg")
def _neg(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    assert ins[0] is not None
    return [np.asarray(-np.asarray(ins[0], dtype=object), dtype=object)]


def _sign_of(d: Any, symbols: Mapping[str, tuple[int, int]]) -> int | None:
    """-1, 0 or 1 when the bounds of the symbols decide the sign of d, else None."""
    bounds = interval(d, symbols)
    if bounds is None:
        return None
    lo, hi = bounds
    if lo > 0:
        return 1
    if hi < 0:
        return -1
    return 0 if lo == hi == 0 else None


def interval(d: Any, symbols: Mapping[str, tuple[int, int]]) -> tuple[int, int] | None:
    """Bounds of a size expression over every shape the declared symbol bounds allow (None: unknown)."""
    return value_range(d, symbols)


_COMPARE: dict[str, Callable[[int], bool]] = {
    "Equal": lambda s: s == 0, "Less": lambda s: s < 0, "Greater": lambda s: s > 0,
    "LessOrEqual": lambda s: s <= 0, "GreaterOrEqual": lambda s: s >= 0,
}


@_folds("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
def _compare(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    a, b = _operands(ins)
    test = _COMPARE[node.op_type]

    def decide(x: Any, y: Any) -> bool:
        sign = _sign_of(x - y, symbols)
        if sign is None:
            raise _Unfoldable  # depends on the symbols' run-time values
        return test(sign)

    return [np.asarray(np.frompyfunc(decide, 2, 1)(a, b), dtype=bool)]


@_folds("Where")
def _where(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    cond, a, b = ins[0], ins[1], ins[2]
    assert a is not None and b is not None
    if cond is None or is_symbolic(cond):
        raise _Unfoldable
    return [np.where(cond.astype(bool), np.asarray(a, dtype=object), np.asarray(b, dtype=object))]


@_folds("ReduceProd", "ReduceSum")
def _reduce(ins: list[np.ndarray | None], node: OnnxNode, symbols: Any) -> list[np.ndarray]:
    data = ins[0]
    assert data is not None
    since = 13 if node.op_type == "ReduceSum" else 18
    if node.version >= since:
        axes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else None
    else:
        axes = node.attr("axes")
    if axes is not None and not len(axes) and node.attr("noop_with_empty_axes", 0):
        return [data]
    axis = None if not axes else tuple(int(a) % data.ndim for a in axes)
    keep = bool(node.attr("keepdims", 1))
    fn = np.prod if node.op_type == "ReduceProd" else np.sum
    return [np.asarray(fn(np.asarray(data, dtype=object), axis=axis, keepdims=keep), dtype=object)]
