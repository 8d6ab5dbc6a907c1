"""Resize: nearest and linear as the IR's `resize` composite, kept whole until placement (ONNX Runtime runs it
as its Resize; elsewhere it lowers to a copy or a matmul per axis, edgerun/ir/ops/resize_ops.py); the
rest (cubic, antialias, tf_crop_and_resize, exclude_outside, an aspect-ratio policy) as one matmul per
resized axis with a constant interpolation matrix.

Every Resize mode (nearest, linear, cubic, antialias) is separable and linear in the input along each axis,
so the whole op is y = x @ M_axis for each resized axis (plus a constant for tf_crop_and_resize's
extrapolation). The matrices are computed at import time by ONNX's own 1-D interpolation routine applied
to basis vectors, so every coordinate mode matches the spec by construction; the data path is our matmul.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.frontends.onnx.symfold import is_symbolic
from edgerun.ir.dtypes import DType
from edgerun.ir.ops.resize_ops import COORDINATE_MODES
from edgerun.ir.symbolic import SymDim


def _coeff_fn(node: OnnxNode, mode: str, nearest_mode: str) -> Any:
    from onnx.reference.ops import op_resize as R

    antialias = bool(node.attr("antialias", 0))
    if mode == "nearest":
        if antialias:
            raise node.refuse("antialias with nearest mode")
        return lambda x, scale: R._nearest_coeffs(x, mode=nearest_mode)
    if mode == "cubic":
        a = float(node.attr("cubic_coeff_a", -0.75))
        fn = R._cubic_coeffs_antialias if antialias else R._cubic_coeffs
        return lambda x, scale: fn(x, scale, A=a)
    if mode == "linear":
        return R._linear_coeffs_antialias if antialias else R._linear_coeffs
    raise node.refuse(f"mode {mode!r}")


def _plan(node: OnnxNode, in_shape: tuple[int, ...], scales: np.ndarray | None, sizes: np.ndarray | None,
          roi: np.ndarray | None) -> tuple[list[float], list[int], list[float] | None]:
    """Per-axis (scale, output size, roi) exactly as ONNX's reference computes them."""
    r = len(in_shape)
    axes_attr = node.attr("axes")
    axes = [int(a) % r for a in axes_attr] if axes_attr is not None else list(range(r))
    scale_f: list[float] | None = None
    out: list[int] | None = None
    if scales is not None and scales.size:
        scale_f = [1.0] * r
        for i, d in enumerate(axes):
            scale_f[d] = float(scales[i])
    if sizes is not None and sizes.size:
        out = list(in_shape)
        for i, d in enumerate(axes):
            out[d] = int(sizes[i])
    roi_full: list[float] | None = None
    if roi is not None and roi.size:
        roi_full = [0.0] * r + [1.0] * r
        for i, d in enumerate(axes):
            roi_full[d], roi_full[r + d] = float(roi[i]), float(roi[len(axes) + i])
    if out is not None:
        scale_f = [out[i] / in_shape[i] for i in range(r)]
        policy = node.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            chosen = [scale_f[a] for a in axes]
            s = min(chosen) if policy == "not_larger" else max(chosen)
            scale_f = [s if i in axes else 1.0 for i in range(r)]
            out = [int(s * in_shape[i] + 0.5) if i in axes else in_shape[i] for i in range(r)]
    elif scale_f is not None:
        out = [int(s * n) for s, n in zip(scale_f, in_shape)]
    else:
        raise node.refuse("neither scales nor sizes given")
    return scale_f, out, roi_full


def _axis_matrix(node: OnnxNode, n: int, scale: float, m: int, coeffs: Any, roi: list[float] | None,
                 ctm: str) -> tuple[np.ndarray, np.ndarray]:
    """(M [n, m], offset [m]) with resize_1d(v) = v @ M + offset."""
    from onnx.reference.ops.op_resize import _interpolate_1d_along_axis

    kw = {"roi": roi, "extrapolation_value": float(node.attr("extrapolation_value", 0.0)),
          "coordinate_transformation_mode": ctm, "exclude_outside": bool(node.attr("exclude_outside", 0))}
    basis = _interpolate_1d_along_axis(np.eye(n), 1, scale, m, coeffs, **kw)
    offset = _interpolate_1d_along_axis(np.zeros((1, n)), 1, scale, m, coeffs, **kw)[0]
    return basis - offset[None, :], offset


@onnx_op("Resize", "Upsample")
def resize(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    # Upsample (deprecated) and opset-10 Resize share one meaning: asymmetric coordinates, floor for nearest.
    x = ctx.input(node, 0)
    shape = ctx.b.shape(x)
    scales: np.ndarray | None
    sizes: np.ndarray | None
    roi: np.ndarray | None
    if node.op_type == "Upsample" and node.version < 9:
        scales, sizes, roi = np.asarray(node.attr("scales"), dtype=np.float32), None, None
        ctm, nearest_mode = "asymmetric", "floor"
    elif node.version < 11 or node.op_type == "Upsample":
        scales, sizes, roi = ctx.static(node, 1, "scales"), None, None
        ctm, nearest_mode = "asymmetric", "floor"
    else:
        roi = ctx.static(node, 1, "roi")
        scales, sizes = ctx.static(node, 2, "scales"), ctx.static(node, 3, "sizes")
        ctm = node.attr("coordinate_transformation_mode", "half_pixel")
        nearest_mode = node.attr("nearest_mode", "round_prefer_floor")
    mode = node.attr("mode", "nearest")
    dtype = ctx.b.dtype(x)
    if not dtype.is_float and mode != "nearest":
        raise node.refuse(f"{mode} resize of {dtype.value}")
    coeffs = _coeff_fn(node, mode, nearest_mode)
    if any(isinstance(d, SymDim) for d in shape):
        return [_repeat_symbolic(ctx, node, x, scales, sizes, mode, ctm, nearest_mode)]
    scale_f, out, roi_full = _plan(node, shape, scales, sizes, roi)
    if _is_composite(node, mode, ctm, dtype):
        return [ctx.emit("resize", [x], mode=mode, coordinate_transformation_mode=ctm, nearest_mode=nearest_mode,
                         scales=scale_f, shape=out)]
    r = len(shape)
    for axis in range(r):
        axis_roi = None if roi_full is None else [roi_full[axis], roi_full[axis + r]]
        identity = math.isclose(scale_f[axis], 1.0) and out[axis] == shape[axis] and \
            (axis_roi is None or (math.isclose(axis_roi[0], 0.0) and math.isclose(axis_roi[1], 1.0)))
        if identity:
            continue
        mat, offset = _axis_matrix(node, shape[axis], scale_f[axis], out[axis], coeffs, axis_roi, ctm)
        x = _apply(ctx, x, axis, mat, offset)
    return [x]


def _is_composite(node: OnnxNode, mode: str, ctm: str, dtype: DType) -> bool:
    """Whether the IR's `resize` composite means exactly this node."""
    return mode in ("nearest", "linear") and ctm in COORDINATE_MODES and dtype is DType.float32 and \
        not node.attr("antialias", 0) and not node.attr("exclude_outside", 0) and \
        node.attr("keep_aspect_ratio_policy", "stretch") == "stretch"


def _apply(ctx: ImportContext, x: str, axis: int, mat: np.ndarray, offset: np.ndarray) -> str:
    shape = ctx.b.shape(x)
    perm = [d for d in range(len(shape)) if d != axis] + [axis]
    xt = ctx.emit("transpose", [x], perm=perm)
    flat = ctx.emit("reshape", [xt], shape=[math.prod(shape[d] for d in perm[:-1]), shape[axis]])
    y = ctx.emit("matmul", [flat, ctx.b.const(mat, ctx.b.dtype(x))])
    if np.any(offset):
        y = ctx.emit("add", [y, ctx.b.const(offset, ctx.b.dtype(x))])
    y = ctx.emit("reshape", [y], shape=[shape[d] for d in perm[:-1]] + [mat.shape[1]])
    return ctx.emit("transpose", [y], perm=[perm.index(d) for d in range(len(shape))])


def _repeat_symbolic(ctx: ImportContext, node: OnnxNode, x: str, scales: np.ndarray | None,
                     sizes: np.ndarray | None, mode: str, ctm: str, nearest_mode: str) -> str:
    """Nearest upsampling by whole factors of a tensor with symbolic dimensions: each element repeated k times.

    The interpolation matrices of the general path depend on the input size, so a symbolic size takes this
    path, which is exact only for nearest mode with asymmetric coordinates and floor rounding (source index
    floor(i / k)); any other Resize of a symbolic size is refused.
    """
    shape = ctx.b.shape(x)
    factors = [] if scales is None or is_symbolic(scales) else [float(v) for v in scales.reshape(-1)]
    whole = len(factors) == len(shape) and all(f >= 1 and f == int(f) for f in factors)
    if (mode, ctm, nearest_mode) != ("nearest", "asymmetric", "floor") or not whole or \
            (sizes is not None and sizes.size) or node.attr("axes") is not None:
        raise node.refuse(f"Resize of a tensor with symbolic dimensions {shape}: only nearest upsampling by whole "
                          "scale factors with asymmetric coordinates and floor rounding is supported; pin the "
                          "dimensions in input_shapes=")
    for axis, k in enumerate(int(f) for f in factors):
        if k == 1:
            continue
        cur = list(ctx.b.shape(x))
        split = [*cur[:axis + 1], 1, *cur[axis + 1:]]
        wide = [*cur[:axis + 1], k, *cur[axis + 1:]]
        y = ctx.emit("expand", [ctx.emit("reshape", [x], shape=split)], shape=wide)
        x = ctx.emit("reshape", [y], shape=[*cur[:axis], cur[axis] * k, *cur[axis + 1:]])
    return x
