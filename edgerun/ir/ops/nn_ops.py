"""Composite neural-network ops, each written once as a decomposition into atomic ops and raster."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgerun.ir.builder import Builder, absent
from edgerun.ir.dtypes import DType
from edgerun.ir.ops._rules import broadcast_shapes, norm_axis, require_float, same_dtype
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.tensor_spec import TensorSpec

Attrs = dict[str, Any]


def _composite(name: str, rule: Any, decompose: Any, lo: int, hi: int | None, doc: str) -> None:
    register(OpDef(name, OpKind.COMPOSITE, rule, lo, hi, decompose=decompose, doc=doc))


def _float_same(op: str):
    def rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
        require_float(ins[0], op)
        return [ins[0]]
    return rule


def _same(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    return [ins[0]]


def _opt(ins: list[str], i: int) -> str:
    return ins[i] if len(ins) > i and ins[i] else ""


# ---- activations -------------------------------------------------------------------------------------

def _relu(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    return [b.binary("maximum", ins[0], b.scalar(0, ins[0]))]


def _clamp(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x = ins[0]
    if attrs.get("min") is not None:
        x = b.binary("maximum", x, b.scalar(attrs["min"], x))
    if attrs.get("max") is not None:
        x = b.binary("minimum", x, b.scalar(attrs["max"], x))
    return [x]


def _leaky_relu(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x = ins[0]
    neg = b.binary("mul", x, b.scalar(float(attrs.get("alpha", 0.01)), x))
    return [b.emit("where", [b.binary("gt", x, b.scalar(0, x)), x, neg])]


def _gelu(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x = ins[0]
    if attrs.get("approximate", "none") == "tanh":
        inner = b.binary("add", x, b.binary("mul", b.scalar(0.044715, x), b.binary("pow", x, b.scalar(3.0, x))))
        t = b.unary("tanh", b.binary("mul", inner, b.scalar(math.sqrt(2 / math.pi), x)))
    else:
        t = b.unary("erf", b.binary("mul", x, b.scalar(1 / math.sqrt(2), x)))
    return [b.binary("mul", b.binary("mul", x, b.scalar(0.5, x)), b.binary("add", t, b.scalar(1.0, x)))]


def _silu(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    return [b.binary("mul", ins[0], b.unary("sigmoid", ins[0]))]


def _hardsigmoid(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x = ins[0]
    alpha, beta = float(attrs.get("alpha", 1 / 6)), float(attrs.get("beta", 0.5))
    y = b.binary("add", b.binary("mul", x, b.scalar(alpha, x)), b.scalar(beta, x))
    return _clamp(b, [y], {"min": 0.0, "max": 1.0})


def _hardswish(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    return [b.binary("mul", ins[0], _hardsigmoid(b, ins, {})[0])]


_composite("relu", _same, _relu, 1, 1, "max(x, 0)")
_composite("clamp", _same, _clamp, 1, 1, "clip to attrs min/max (either may be None); ReLU6, hardtanh")
_composite("leaky_relu", _float_same("leaky_relu"), _leaky_relu, 1, 1, "x if x>0 else alpha*x")
_composite("gelu", _float_same("gelu"), _gelu, 1, 1, "GELU, exact (erf) or attr approximate='tanh'")
_composite("silu", _float_same("silu"), _silu, 1, 1, "x*sigmoid(x)")
_composite("hardsigmoid", _float_same("hardsigmoid"), _hardsigmoid, 1, 1, "clip(alpha*x+beta, 0, 1)")
_composite("hardswish", _float_same("hardswish"), _hardswish, 1, 1, "x*hardsigmoid(x)")

# ---- softmax -----------------------------------------------------------------------------------------


def _softmax_parts(b: Builder, x: str, axis: int) -> tuple[str, str]:
    """(shifted, sum of exp(shifted)) along axis: the max is subtracted first for stability."""
    shifted = b.binary("sub", x, b.emit("reduce_max", [x], axes=[axis], keepdims=True))
    return shifted, b.emit("reduce_sum", [b.unary("exp", shifted)], axes=[axis], keepdims=True)


def _softmax(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    axis = norm_axis(int(attrs.get("axis", -1)), len(b.shape(ins[0])))
    shifted, total = _softmax_parts(b, ins[0], axis)
    return [b.binary("div", b.unary("exp", shifted), total)]


def _log_softmax(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    axis = norm_axis(int(attrs.get("axis", -1)), len(b.shape(ins[0])))
    shifted, total = _softmax_parts(b, ins[0], axis)
    return [b.binary("sub", shifted, b.unary("log", total))]


_composite("softmax", _float_same("softmax"), _softmax, 1, 1, "exp(x)/sum(exp(x)) along attr axis")
_composite("log_softmax", _float_same("log_softmax"), _log_softmax, 1, 1, "log of softmax along attr axis")

# ---- linear ------------------------------------------------------------------------------------------


def _linear_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x, w = ins[0], ins[1]
    dtype = same_dtype([x, w], "linear")
    if w.rank != 2 or x.rank < 1 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"linear needs x[..., in] and weight[out, in], got {x} and {w}")
    if len(ins) > 2 and not absent(ins[2]) and ins[2].shape != (w.shape[0],):
        raise ValueError(f"linear bias must have shape ({w.shape[0]},), got {ins[2]}")
    return [TensorSpec((*x.shape[:-1], w.shape[0]), dtype)]


def _linear(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x, w, bias = ins[0], ins[1], _opt(ins, 2)
    x_shape = b.shape(x)
    x2 = b.emit("reshape", [x], shape=[1, x_shape[0]]) if len(x_shape) == 1 else x
    y = b.emit("matmul", [x2, b.emit("transpose", [w], perm=[1, 0])])
    if bias:
        y = b.binary("add", y, bias)
    if len(x_shape) == 1:
        y = b.emit("reshape", [y], shape=[b.shape(w)[0]])
    return [y]


_composite("linear", _linear_rule, _linear, 2, 3, "x @ weight.T + bias (weight is [out, in], as in torch)")

# ---- normalisation -----------------------------------------------------------------------------------


def _batch_norm_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    require_float(x, "batch_norm")
    if x.rank < 2 or any(s.shape != (x.shape[1],) for s in ins[1:] if not absent(s)):
        raise ValueError(f"batch_norm needs x[N, C, ...] and per-channel statistics, got {[str(s) for s in ins]}")
    return [x]


def _channel_view(b: Builder, v: str, rank: int) -> str:
    return b.emit("reshape", [v], shape=[b.shape(v)[0]] + [1] * (rank - 2))


def _batch_norm(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    # Inputs: x, weight, bias, running_mean, running_var (weight and bias may be omitted as "").
    x, weight, bias, mean, var = ins[0], _opt(ins, 1), _opt(ins, 2), ins[3], ins[4]
    rank = len(b.shape(x))
    inv = b.unary("rsqrt", b.binary("add", var, b.scalar(float(attrs.get("eps", 1e-5)), var)))
    scale = b.binary("mul", inv, weight) if weight else inv
    shift = b.binary("sub", bias, b.binary("mul", mean, scale)) if bias else \
        b.unary("neg", b.binary("mul", mean, scale))
    y = b.binary("mul", x, _channel_view(b, scale, rank))
    return [b.binary("add", y, _channel_view(b, shift, rank))]


_composite("batch_norm", _batch_norm_rule, _batch_norm, 5, 5,
           "inference batch norm: inputs x, weight, bias, running_mean, running_var; attr eps")


def _norm_axes(rank: int, attrs: Attrs) -> list[int]:
    n = int(attrs.get("normalized_ndim", 1))
    if not 1 <= n <= rank:
        raise ValueError(f"normalized_ndim {n} does not fit rank {rank}")
    return list(range(rank - n, rank))


def _layer_norm_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    require_float(x, "layer_norm")
    axes = _norm_axes(x.rank, attrs)
    for s in ins[1:]:
        if not absent(s):
            broadcast_shapes(x.shape, s.shape)
            if s.rank > len(axes):
                raise ValueError(f"layer_norm affine params {s} span more than the normalised axes")
    return [x]


def _affine(b: Builder, y: str, ins: list[str], first: int) -> str:
    weight, bias = _opt(ins, first), _opt(ins, first + 1)
    if weight:
        y = b.binary("mul", y, weight)
    if bias:
        y = b.binary("add", y, bias)
    return y


def _layer_norm(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x = ins[0]
    axes = _norm_axes(len(b.shape(x)), attrs)
    centered = b.binary("sub", x, b.emit("reduce_mean", [x], axes=axes, keepdims=True))
    var = b.emit("reduce_mean", [b.binary("mul", centered, centered)], axes=axes, keepdims=True)
    inv = b.unary("rsqrt", b.binary("add", var, b.scalar(float(attrs.get("eps", 1e-5)), var)))
    return [_affine(b, b.binary("mul", centered, inv), ins, 1)]


_composite("layer_norm", _layer_norm_rule, _layer_norm, 1, 3,
           "normalise the last attr normalized_ndim axes; optional weight, bias; attr eps")


def _rms_norm(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x = ins[0]
    axes = _norm_axes(len(b.shape(x)), attrs)
    ms = b.emit("reduce_mean", [b.binary("mul", x, x)], axes=axes, keepdims=True)
    inv = b.unary("rsqrt", b.binary("add", ms, b.scalar(float(attrs.get("eps", 1e-6)), ms)))
    return [_affine(b, b.binary("mul", x, inv), ins, 1)]


_composite("rms_norm", _layer_norm_rule, _rms_norm, 1, 2,
           "x / sqrt(mean(x^2) + eps) over the last attr normalized_ndim axes, times optional weight")

# ---- attention ---------------------------------------------------------------------------------------


def _sdpa_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    q, k, v = ins[0], ins[1], ins[2]
    same_dtype([q, k, v], "scaled_dot_product_attention")
    require_float(q, "scaled_dot_product_attention")
    if min(q.rank, k.rank, v.rank) < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"attention needs q[..., L, E], k[..., S, E], v[..., S, Ev]; got {q}, {k}, {v}")
    batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if len(ins) > 3 and not absent(ins[3]):
        broadcast_shapes(ins[3].shape, (*batch, q.shape[-2], k.shape[-2]))
    return [TensorSpec((*batch, q.shape[-2], v.shape[-1]), q.dtype)]


def _sdpa(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    q, k, v, mask = ins[0], ins[1], ins[2], _opt(ins, 3)
    q_shape, k_shape = b.shape(q), b.shape(k)
    rank = len(k_shape)
    scale = attrs.get("scale")
    scale = float(scale) if scale is not None else 1.0 / math.sqrt(q_shape[-1])
    kt = b.emit("transpose", [k], perm=[*range(rank - 2), rank - 1, rank - 2])
    scores = b.binary("mul", b.emit("matmul", [q, kt]), b.scalar(scale, q))
    if attrs.get("is_causal"):
        L, S = q_shape[-2], k_shape[-2]
        # Top-left aligned when L != S, as torch's scaled_dot_product_attention and ONNX Attention define it.
        causal = np.tril(np.ones((L, S), dtype=bool), k=0)
        scores = b.emit("where", [b.const(causal), scores, b.scalar(-np.inf, scores)])
    if mask:
        if b.dtype(mask) is DType.bool:
            scores = b.emit("where", [mask, scores, b.scalar(-np.inf, scores)])
        else:
            scores = b.binary("add", scores, mask)
    probs = b.emit("softmax", [scores], axis=-1)
    return [b.emit("matmul", [probs, v])]


_composite("scaled_dot_product_attention", _sdpa_rule, _sdpa, 3, 4,
           "softmax(q k^T * scale + mask) v; optional mask (bool keep-mask or additive float); "
           "attrs is_causal, scale")

# ---- pooling -----------------------------------------------------------------------------------------


def _adaptive_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    if x.rank != 4:
        raise ValueError(f"adaptive_avg_pool2d needs NCHW, got {x}")
    oh, ow = (int(v) for v in attrs["output_size"])
    if oh < 1 or ow < 1:
        raise ValueError("adaptive_avg_pool2d output_size must be positive")
    return [TensorSpec((x.shape[0], x.shape[1], oh, ow), x.dtype)]


def _adaptive_bins(n: int, out: int) -> list[tuple[int, int]]:
    return [((i * n) // out, -((-(i + 1) * n) // out)) for i in range(out)]


def _adaptive_avg_pool2d(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x = ins[0]
    _, _, h, w = b.shape(x)
    oh, ow = (int(v) for v in attrs["output_size"])
    if (oh, ow) == (1, 1):
        return [b.emit("reduce_mean", [x], axes=[2, 3], keepdims=True)]
    if h % oh == 0 and w % ow == 0:
        return [b.emit("avg_pool2d", [x], kernel=[h // oh, w // ow], stride=[h // oh, w // ow])]
    rows = []
    for r0, r1 in _adaptive_bins(h, oh):
        cols = []
        for c0, c1 in _adaptive_bins(w, ow):
            cell = b.emit("slice", [x], starts=[r0, c0], ends=[r1, c1], axes=[2, 3])
            cols.append(b.emit("reduce_mean", [cell], axes=[2, 3], keepdims=True))
        rows.append(b.emit("concat", cols, axis=3))
    return [b.emit("concat", rows, axis=2)]


_composite("adaptive_avg_pool2d", _adaptive_rule, _adaptive_avg_pool2d, 1, 1,
           "average over attr output_size adaptive bins (PyTorch's bin edges)")
