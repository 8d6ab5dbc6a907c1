"""Handlers for ATen reductions: sum, mean, max/min (values and indices), any/all, var/std, softmax, cumsum."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerun.frontends.torch.context import ConvertContext, handles
from edgerun.ir.dtypes import DType


def _axes(ctx: ConvertContext, dims: Any, rank: int) -> list[int] | None:
    """Normalised reduction axes; None or [] mean every axis (torch's convention for sum/mean/amax)."""
    if dims is None:
        return None
    if isinstance(dims, int):
        dims = [dims]
    if len(dims) == 0:
        return None
    return sorted({int(d) % max(rank, 1) for d in dims})


def _reduce(ctx: ConvertContext, op: str, x: str, axes: list[int] | None, keepdim: bool) -> str:
    rank = len(ctx.b.shape(x))
    if rank == 0:
        return x
    return ctx.b.emit(op, [x], axes=axes if axes is not None else list(range(rank)), keepdims=bool(keepdim))


@handles("aten.sum.dim_IntList", "aten.sum.default")
def _sum(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.operand(a["self"], ctx.out_dtype(node))
    return _reduce(ctx, "reduce_sum", x, _axes(ctx, a.get("dim"), len(ctx.b.shape(x))), a.get("keepdim", False))


@handles("aten.mean.dim", "aten.mean.default")
def _mean(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.operand(a["self"], ctx.out_dtype(node))
    return _reduce(ctx, "reduce_mean", x, _axes(ctx, a.get("dim"), len(ctx.b.shape(x))), a.get("keepdim", False))


def _minmax_reduce(ctx: ConvertContext, x: str, op: str, axes: list[int] | None, keepdim: bool) -> str:
    dtype = ctx.b.dtype(x)
    if dtype is DType.bool:  # reduce over 0/1 so every backend needs only numeric reductions
        y = _reduce(ctx, op, ctx.cast(x, DType.int32), axes, keepdim)
        return ctx.cast(y, DType.bool)
    return _reduce(ctx, op, x, axes, keepdim)


@handles("aten.amax.default", "aten.amin.default", "aten.max.default", "aten.min.default")
def _amax(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    if 0 in ctx.b.shape(x):
        ctx.unsupported("max/min of an empty tensor")
    op = "reduce_max" if "max" in str(node.target) else "reduce_min"
    return _minmax_reduce(ctx, x, op, _axes(ctx, a.get("dim"), len(ctx.b.shape(x))), a.get("keepdim", False))


@handles("aten.max.dim", "aten.min.dim")
def _max_dim(ctx: ConvertContext, node: Any) -> list[str]:
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    rank = len(ctx.b.shape(x))
    keep = bool(a["keepdim"])
    is_max = "max" in str(node.target)
    if rank == 0:
        return [x, ctx.b.const(np.asarray(0, np.int64))]
    axis = int(a["dim"]) % rank
    values = _minmax_reduce(ctx, x, "reduce_max" if is_max else "reduce_min", [axis], keep)
    src = ctx.cast(x, DType.int32) if ctx.b.dtype(x) is DType.bool else x
    indices = ctx.b.emit("argmax" if is_max else "argmin", [src], axis=axis, keepdims=keep)
    return [values, indices]


@handles("aten.argmax.default", "aten.argmin.default")
def _argmax(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    if ctx.b.dtype(x) is DType.bool:
        x = ctx.cast(x, DType.int32)
    op = "argmax" if "argmax" in str(node.target) else "argmin"
    shape = ctx.b.shape(x)
    if a["dim"] is None:
        flat = ctx.b.emit("reshape", [x], shape=[-1])
        y = ctx.b.emit(op, [flat], axis=0, keepdims=False)
        return ctx.b.emit("reshape", [y], shape=[1] * len(shape)) if a["keepdim"] else y
    if not shape:
        return ctx.b.const(np.asarray(0, np.int64))
    return ctx.b.emit(op, [x], axis=int(a["dim"]) % len(shape), keepdims=bool(a["keepdim"]))


@handles("aten.any.default", "aten.any.dim", "aten.any.dims", "aten.all.default", "aten.all.dim",
         "aten.all.dims")
def _any_all(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    if ctx.out_dtype(node) is not DType.bool:
        ctx.unsupported("any/all producing a non-boolean (uint8) result")
    flags = x if ctx.b.dtype(x) is DType.bool else ctx.b.binary("ne", x, ctx.b.scalar(0, x))
    op = "reduce_max" if "any" in str(node.target) else "reduce_min"
    if 0 in ctx.b.shape(x):
        ctx.unsupported("any/all of an empty tensor")
    return _minmax_reduce(ctx, flags, op, _axes(ctx, a.get("dim"), len(ctx.b.shape(x))), a.get("keepdim", False))


@handles("aten.var.correction", "aten.var.dim", "aten.std.correction", "aten.std.dim")
def _var(ctx: ConvertContext, node: Any) -> str:
    return _variance(ctx, node)[0]


@handles("aten.var_mean.correction", "aten.std_mean.correction")
def _var_mean(ctx: ConvertContext, node: Any) -> list[str]:
    return _variance(ctx, node)


def _variance(ctx: ConvertContext, node: Any) -> list[str]:
    """[variance or standard deviation, mean] as var/std/var_mean/std_mean define them."""
    a = ctx.bind(node)
    x = ctx.v(a["self"])
    if not ctx.b.dtype(x).is_float:
        ctx.unsupported("variance of integers")
    shape = ctx.b.shape(x)
    axes = _axes(ctx, a.get("dim"), len(shape))
    axes_list = axes if axes is not None else list(range(len(shape)))
    correction = a.get("correction")
    if "unbiased" in a:
        correction = 1 if a["unbiased"] else 0
    correction = 1 if correction is None else float(correction)
    n = int(np.prod([shape[i] for i in axes_list])) if shape else 1
    b = ctx.b
    mean = _reduce(ctx, "reduce_mean", x, axes_list, True)
    centered = b.binary("sub", x, mean)
    total = _reduce(ctx, "reduce_sum", b.binary("mul", centered, centered), axes_list, bool(a["keepdim"]))
    # torch divides by max(0, n - correction): no degrees of freedom gives inf, or nan for 0/0.
    var = b.binary("div", total, b.scalar(max(0.0, n - correction), total))
    if not a["keepdim"]:
        mean = b.emit("reshape", [mean], shape=list(b.shape(var)))
    return [b.unary("sqrt", var) if "std" in str(node.target) else var, mean]


@handles("aten._softmax.default", "aten._log_softmax.default", "aten.softmax.int", "aten.log_softmax.int")
def _softmax(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    if not dtype.is_float:
        ctx.unsupported("softmax of integers")
    x = ctx.operand(a["self"], dtype)
    if not ctx.b.shape(x):
        x1 = ctx.b.emit("reshape", [x], shape=[1])
        y = ctx.b.emit("log_softmax" if "log" in str(node.target) else "softmax", [x1], axis=0)
        return ctx.b.emit("reshape", [y], shape=[])
    op = "log_softmax" if "log" in str(node.target) else "softmax"
    return ctx.b.emit(op, [x], axis=int(a["dim"]))


@handles("aten.cumsum.default")
def _cumsum(ctx: ConvertContext, node: Any) -> str:
    """Prefix sums as a matmul with an upper-triangular ones matrix: no scan op needed in any backend."""
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    if dtype is DType.bool:
        ctx.unsupported("cumsum producing booleans")
    x = ctx.operand(a["self"], dtype)
    shape = ctx.b.shape(x)
    if not shape:
        return x
    rank = len(shape)
    axis = int(a["dim"]) % rank
    n = shape[axis]
    if n == 0:
        return x
    b = ctx.b
    perm = [i for i in range(rank) if i != axis] + [axis]
    moved = b.emit("transpose", [x], perm=perm)
    if rank == 1:
        moved = b.emit("reshape", [moved], shape=[1, n])
    tri = b.const(np.triu(np.ones((n, n))), dtype)
    summed = b.emit("matmul", [moved, tri])
    if rank == 1:
        return b.emit("reshape", [summed], shape=[n])
    inverse = [perm.index(i) for i in range(rank)]
    return b.emit("transpose", [summed], perm=inverse)


@handles("aten.linalg_vector_norm.default")
def _vector_norm(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    dtype = ctx.out_dtype(node)
    if not dtype.is_float:
        ctx.unsupported("norm of integers")
    x = ctx.operand(a["self"], dtype)
    shape = ctx.b.shape(x)
    axes = _axes(ctx, a["dim"], len(shape))
    keep = bool(a["keepdim"])
    order = float(a["ord"])
    b = ctx.b
    mag = b.unary("abs", x)
    if order == float("inf") or order == float("-inf"):
        if 0 in shape:
            ctx.unsupported("inf-norm of an empty tensor")
        return _reduce(ctx, "reduce_max" if order > 0 else "reduce_min", mag, axes, keep)
    if order == 0:
        return _reduce(ctx, "reduce_sum", ctx.cast(b.binary("ne", x, b.scalar(0, x)), dtype), axes, keep)
    if order == 1:
        return _reduce(ctx, "reduce_sum", mag, axes, keep)
    if order == 2:
        return b.unary("sqrt", _reduce(ctx, "reduce_sum", b.binary("mul", x, x), axes, keep))
    powered = b.binary("pow", mag, b.scalar(order, mag))
    total = _reduce(ctx, "reduce_sum", powered, axes, keep)
    return b.binary("pow", total, b.scalar(1.0 / order, total))
