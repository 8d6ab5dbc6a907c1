"""Handlers for ATen neural-network ops: matmul family, convolution, normalisation, attention, embedding.

Pooling and resampling live in aten_pooling.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerun.frontends.torch.aten_conv_transpose import transposed_convolution
from edgerun.frontends.torch.context import ConvertContext, handles, reads_beyond, reject_extra_outputs
from edgerun.ir.dtypes import DType


def _float_operands(ctx: ConvertContext, node: Any, *args: Any) -> list[str]:
    dtype = ctx.out_dtype(node)
    return [ctx.operand(a, dtype) if a is not None else "" for a in args]


# ---- matrix products ---------------------------------------------------------------------------------

def _matmul_any_rank(ctx: ConvertContext, a: str, b: str) -> str:
    """torch.matmul semantics: 1-D operands become a row/column and the added axis is dropped again."""
    sa, sb = ctx.b.shape(a), ctx.b.shape(b)
    if not sa or not sb:
        ctx.unsupported("matmul of a 0-d tensor")
    a2 = ctx.b.emit("reshape", [a], shape=[1, sa[0]]) if len(sa) == 1 else a
    b2 = ctx.b.emit("reshape", [b], shape=[sb[0], 1]) if len(sb) == 1 else b
    y = ctx.b.emit("matmul", [a2, b2])
    if len(sa) == 1 or len(sb) == 1:
        shape = list(ctx.b.shape(y))
        if len(sb) == 1:
            shape.pop(-1)
        if len(sa) == 1:
            shape.pop(-1 if len(sb) == 1 else -2)
        y = ctx.b.emit("reshape", [y], shape=shape)
    return y


@handles("aten.mm.default", "aten.bmm.default", "aten.matmul.default", "aten.mv.default", "aten.dot.default")
def _mm(ctx: ConvertContext, node: Any) -> str:
    if ctx.out_dtype(node) is DType.bool:
        ctx.unsupported("boolean matmul")
    a, b = _float_operands(ctx, node, node.args[0], node.args[1])
    return _matmul_any_rank(ctx, a, b)


@handles("aten.addmm.default", "aten.baddbmm.default", "aten.addmv.default")
def _addmm(ctx: ConvertContext, node: Any) -> str:
    args = ctx.bind(node)
    names = [n for n in args if n not in ("beta", "alpha")]
    bias, a, b = _float_operands(ctx, node, *(args[n] for n in names[:3]))
    beta, alpha = args["beta"], args["alpha"]
    y = _matmul_any_rank(ctx, a, b)
    if alpha != 1:
        y = ctx.b.binary("mul", y, ctx.b.scalar(alpha, y))
    if beta == 0:  # torch ignores the bias entirely (NaNs in it do not propagate)
        out = y
    else:
        bias_term = bias if beta == 1 else ctx.b.binary("mul", bias, ctx.b.scalar(beta, bias))
        out = ctx.b.binary("add", bias_term, y)
    if ctx.b.shape(out) != ctx.out_shape(node):
        out = ctx.b.emit("expand", [out], shape=list(ctx.out_shape(node)))
    return out


@handles("aten.linear.default")
def _linear(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x, w, bias = _float_operands(ctx, node, a["input"], a["weight"], a["bias"])
    if len(ctx.b.shape(w)) != 2 or not ctx.b.shape(x):
        ctx.unsupported("linear with a weight that is not 2-D")
    if bias and len(ctx.b.shape(bias)) != 1:
        ctx.unsupported("linear with a bias that is not 1-D")
    return ctx.b.emit("linear", [x, w, bias] if bias else [x, w])


# ---- convolution -------------------------------------------------------------------------------------

@handles("aten.convolution.default")
def _convolution(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x, w, bias = _float_operands(ctx, node, a["input"], a["weight"], a["bias"])
    if not ctx.b.dtype(x).is_float:
        ctx.unsupported("integer convolution")
    if a["transposed"]:
        return transposed_convolution(ctx, node, a, x, w, bias)
    rank = len(ctx.b.shape(w))
    spatial = max(rank - 2, 1)
    stride, padding, dilation = (_per_axis(a[k], spatial) for k in ("stride", "padding", "dilation"))
    if rank == 3:  # conv1d as a conv2d over a height of one
        x_shape, w_shape = ctx.b.shape(x), ctx.b.shape(w)
        unbatched = len(x_shape) == 2
        x = ctx.b.emit("reshape", [x], shape=[1 if unbatched else x_shape[0], x_shape[-2], 1, x_shape[-1]])
        w = ctx.b.emit("reshape", [w], shape=[w_shape[0], w_shape[1], 1, w_shape[2]])
        y = ctx.b.emit("conv2d", [x, w, bias] if bias else [x, w], stride=[1, int(stride[0])],
                       padding=[0, int(padding[0]), 0, int(padding[0])], dilation=[1, int(dilation[0])],
                       groups=int(a["groups"]))
        return ctx.b.emit("reshape", [y], shape=list(ctx.out_shape(node)))
    if rank != 4:
        ctx.unsupported(f"{rank - 2}-D convolution (1-D and 2-D are supported)")
    unbatched = len(ctx.b.shape(x)) == 3
    if unbatched:
        x = ctx.b.emit("reshape", [x], shape=[1, *ctx.b.shape(x)])
    ph, pw = (int(p) for p in padding)
    y = ctx.b.emit("conv2d", [x, w, bias] if bias else [x, w], stride=[int(s) for s in stride],
                   padding=[ph, pw, ph, pw], dilation=[int(d) for d in dilation], groups=int(a["groups"]))
    return ctx.b.emit("reshape", [y], shape=list(ctx.out_shape(node))) if unbatched else y


def _per_axis(v: Any, n: int) -> list[int]:
    """A per-spatial-axis list; torch allows one value for every axis."""
    values = [int(x) for x in (v if isinstance(v, list | tuple) else [v])]
    return values * n if len(values) == 1 else values


# ---- normalisation -----------------------------------------------------------------------------------

@handles("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(ctx: ConvertContext, node: Any) -> list[str | None]:
    return _inference_batch_norm(ctx, node)


def _inference_batch_norm(ctx: ConvertContext, node: Any) -> list[str | None]:
    a = ctx.bind(node)
    x = ctx.v(a["input"])
    if len(ctx.b.shape(x)) < 2:
        ctx.unsupported("batch norm of a tensor without a channel axis")
    dtype = ctx.b.dtype(x)
    w, bias, mean, var = (ctx.operand(a[n], dtype) if a[n] is not None else ""
                          for n in ("weight", "bias", "running_mean", "running_var"))
    y = ctx.b.emit("batch_norm", [x, w, bias, mean, var], eps=float(a["eps"]))
    # Inference batch norm saves no statistics: torch returns empty tensors for them.
    rest = ctx.fake(node)[1:]
    if any(v.numel() for v in rest):
        reject_extra_outputs(ctx, node, 1)
    empties: list[str | None] = [ctx.b.const(np.zeros(tuple(v.shape)), ctx.dtype_of_torch(v.dtype))
                                 for v in rest]
    return [y, *empties]


@handles("aten._native_batch_norm_legit_functional.default", "aten._native_batch_norm_legit.no_stats",
         "aten._native_batch_norm_legit.default", "aten.native_batch_norm.default")
def _batch_norm_batch_stats(ctx: ConvertContext, node: Any) -> list[str | None]:
    """Training-mode batch norm: normalise with the batch's own statistics (biased variance).

    Outputs: y, the batch mean, 1/std, and for the functional form the updated running statistics
    (momentum-weighted, with the unbiased variance, as torch updates them)."""
    a = ctx.bind(node)
    if "training" in a and not a["training"]:
        return _inference_batch_norm(ctx, node)
    x = ctx.v(a["input"])
    shape = ctx.b.shape(x)
    if len(shape) < 2 or not ctx.b.dtype(x).is_float or 0 in shape:
        ctx.unsupported("batch norm of this input")
    dtype = ctx.b.dtype(x)
    b = ctx.b
    axes = [i for i in range(len(shape)) if i != 1]
    mean = b.emit("reduce_mean", [x], axes=axes, keepdims=True)
    centered = b.binary("sub", x, mean)
    var = b.emit("reduce_mean", [b.binary("mul", centered, centered)], axes=axes, keepdims=True)
    rstd = b.unary("rsqrt", b.binary("add", var, b.scalar(float(a["eps"]), var)))
    y = b.binary("mul", centered, rstd)
    channel = [shape[1]] + [1] * (len(shape) - 2)
    if a["weight"] is not None:
        y = b.binary("mul", y, b.emit("reshape", [ctx.operand(a["weight"], dtype)], shape=channel))
    if a["bias"] is not None:
        y = b.binary("add", y, b.emit("reshape", [ctx.operand(a["bias"], dtype)], shape=channel))
    outputs: list[str | None] = [y] + [None] * (len(ctx.fake(node)) - 1)
    if not reads_beyond(ctx, node, 1):
        return outputs
    batch_mean = b.emit("reshape", [mean], shape=[shape[1]])
    outputs[1] = batch_mean
    outputs[2] = b.emit("reshape", [rstd], shape=[shape[1]])
    if len(outputs) == 5 and a.get("running_mean") is not None:
        momentum = float(a["momentum"])
        count = int(np.prod(shape)) // shape[1]
        unbiased = b.binary("mul", b.emit("reshape", [var], shape=[shape[1]]),
                            b.scalar(count / max(count - 1, 1), var))
        for i, (stat, batch) in enumerate(((a["running_mean"], batch_mean), (a["running_var"], unbiased))):
            old = ctx.operand(stat, dtype)
            outputs[3 + i] = b.binary("add", b.binary("mul", old, b.scalar(1 - momentum, old)),
                                      b.binary("mul", batch, b.scalar(momentum, batch)))
    return outputs


@handles("aten.native_layer_norm.default")
def _layer_norm(ctx: ConvertContext, node: Any) -> list[str | None]:
    a = ctx.bind(node)
    x = ctx.v(a["input"])
    dtype = ctx.b.dtype(x)
    w = ctx.operand(a["weight"], dtype) if a["weight"] is not None else ""
    bias = ctx.operand(a["bias"], dtype) if a["bias"] is not None else ""
    ins = [x, w, bias] if bias else [x, w] if w else [x]
    if not w and bias:
        ins = [x, ctx.b.const(np.ones(ctx.b.shape(bias)), dtype), bias]
    n = len(a["normalized_shape"])
    if n == 0:
        ctx.unsupported("layer norm over no axes")
    if not ctx.b.dtype(x).is_float or 0 in ctx.b.shape(x):
        ctx.unsupported("layer norm of this input")
    y = ctx.b.emit("layer_norm", ins, normalized_ndim=n, eps=float(a["eps"]))
    if not reads_beyond(ctx, node, 1):
        return [y, None, None]
    return [y, *_layer_norm_stats(ctx, x, n, float(a["eps"]))]


def _layer_norm_stats(ctx: ConvertContext, x: str, n: int, eps: float) -> list[str]:
    """native_layer_norm's saved mean and 1/std (shape with the normalised axes kept as 1); the passes
    drop them when nothing reads them."""
    b = ctx.b
    axes = list(range(len(b.shape(x)) - n, len(b.shape(x))))
    mean = b.emit("reduce_mean", [x], axes=axes, keepdims=True)
    centered = b.binary("sub", x, mean)
    var = b.emit("reduce_mean", [b.binary("mul", centered, centered)], axes=axes, keepdims=True)
    return [mean, b.unary("rsqrt", b.binary("add", var, b.scalar(eps, var)))]


@handles("aten.rms_norm.default")
def _rms_norm(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    x = ctx.v(a["input"])
    dtype = ctx.b.dtype(x)
    w = ctx.operand(a["weight"], dtype) if a["weight"] is not None else ""
    eps = a["eps"]
    if eps is None:
        eps = float(np.finfo(dtype.np).eps)
    return ctx.b.emit("rms_norm", [x, w] if w else [x], normalized_ndim=len(a["normalized_shape"]),
                      eps=float(eps))


# ---- attention ---------------------------------------------------------------------------------------

@handles("aten.scaled_dot_product_attention.default")
def _sdpa(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    if a["dropout_p"]:
        ctx.unsupported("attention dropout (export the model in eval mode with dropout_p=0)")
    if a.get("enable_gqa"):
        ctx.unsupported("grouped-query attention via enable_gqa (repeat the key/value heads first)")
    dtype = ctx.out_dtype(node)
    q, k, v = (ctx.operand(a[n], dtype) for n in ("query", "key", "value"))
    ins = [q, k, v]
    if a["attn_mask"] is not None:
        mask = ctx.v(a["attn_mask"])
        ins.append(mask if ctx.b.dtype(mask) is DType.bool else ctx.cast(mask, dtype))
    if a["is_causal"] and a["attn_mask"] is not None:
        ctx.unsupported("attention with both a mask and is_causal")
    return ctx.b.emit("scaled_dot_product_attention", ins, is_causal=bool(a["is_causal"]), scale=a["scale"])


# ---- embedding ---------------------------------------------------------------------------------------

@handles("aten.embedding.default")
def _embedding(ctx: ConvertContext, node: Any) -> str:
    a = ctx.bind(node)
    weight, indices = ctx.v(a["weight"]), ctx.v(a["indices"])
    if len(ctx.b.shape(weight)) != 2:
        ctx.unsupported("embedding with a weight that is not 2-D")
    # What training needs to know and the forward does not: padding_idx's row takes no gradient, and
    # scale_grad_by_freq divides each row's gradient by its count (ir/ops/atomic_gradients.py).
    extra: dict[str, Any] = {}
    padding = a.get("padding_idx", -1)
    if isinstance(padding, int) and padding >= 0:
        extra["padding_index"] = padding
    if a.get("scale_grad_by_freq"):
        extra["scale_grad_by_freq"] = True
    return ctx.b.emit("gather", [weight, indices], axis=0, **extra)


@handles("aten.native_group_norm.default")
def _group_norm(ctx: ConvertContext, node: Any) -> list[str | None]:
    """GroupNorm (diffusion U-Nets, detectors' heads): each sample's channels in `group` groups, normalised
    over a group's channels and positions (biased variance), then the per-channel affine."""
    a = ctx.bind(node)
    x = ctx.v(a["input"])
    shape = ctx.b.shape(x)
    dtype = ctx.b.dtype(x)
    groups = int(a["group"])
    if len(shape) < 2 or not dtype.is_float or 0 in shape:
        ctx.unsupported("group norm of this input")
    b = ctx.b
    n, c = shape[0], shape[1]
    grouped = b.emit("reshape", [x], shape=[n, groups, -1])
    mean, rstd = _layer_norm_stats(ctx, grouped, 1, float(a["eps"]))
    y = b.emit("reshape", [b.binary("mul", b.binary("sub", grouped, mean), rstd)], shape=list(shape))
    channel = [c] + [1] * (len(shape) - 2)
    if a["weight"] is not None:
        y = b.binary("mul", y, b.emit("reshape", [ctx.operand(a["weight"], dtype)], shape=channel))
    if a["bias"] is not None:
        y = b.binary("add", y, b.emit("reshape", [ctx.operand(a["bias"], dtype)], shape=channel))
    if not reads_beyond(ctx, node, 1):
        return [y, None, None]
    return [y, b.emit("reshape", [mean], shape=[n, groups]), b.emit("reshape", [rstd], shape=[n, groups])]
