"""Resize (nearest and linear interpolation), a composite kept until placement.

ONNX Runtime has one kernel for it; lowered, a nearest resize is a copy (a raster: one strided region per
axis for whole-factor scales, else a gather of rows) and a linear one a matmul by a constant interpolation
matrix per resized axis. The decomposition is the semantics, and it follows ONNX's reference implementation
(onnx.reference.ops.op_resize) coordinate mode by coordinate mode: tests/ir/test_ir_resize.py checks it there.

attrs: `mode` ("nearest" | "linear"), `coordinate_transformation_mode` (one of COORDINATE_MODES),
`nearest_mode` (one of NEAREST_MODES), `scales` (per axis, the scale the coordinates are mapped with; for a
model that gave sizes, size_out / size_in), `shape` (the output shape).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.ops.raster import strided_copy_regions
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.tensor_spec import TensorSpec, contiguous_strides

Attrs = dict[str, Any]

MODES = ("nearest", "linear")
COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")


def _checked(ins: list[TensorSpec], attrs: Attrs) -> tuple[list[float], list[int]]:
    x = ins[0]
    mode = attrs.get("mode")
    ctm = attrs.get("coordinate_transformation_mode")
    if mode not in MODES:
        raise ValueError(f"resize mode must be one of {MODES}, got {mode!r}")
    if ctm not in COORDINATE_MODES:
        raise ValueError(f"resize coordinate_transformation_mode must be one of {COORDINATE_MODES}, got {ctm!r}")
    if mode == "nearest" and attrs.get("nearest_mode") not in NEAREST_MODES:
        raise ValueError(f"resize nearest_mode must be one of {NEAREST_MODES}, got {attrs.get('nearest_mode')!r}")
    if not x.dtype.is_float:
        raise ValueError(f"resize needs a float input, got {x.dtype.value}")
    scales = [float(s) for s in attrs["scales"]]
    shape = [int(n) for n in attrs["shape"]]
    if len(scales) != x.rank or len(shape) != x.rank:
        raise ValueError(f"resize needs a scale and an output size per axis of {x.shape}, got {scales}, {shape}")
    if any(s <= 0 for s in scales) or any(n < 1 for n in shape):
        raise ValueError(f"resize scales must be positive and sizes at least 1, got {scales}, {shape}")
    return scales, shape


def _resize_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    _, shape = _checked(ins, attrs)
    return [TensorSpec(tuple(shape), ins[0].dtype)]


def source_coordinates(n: int, m: int, scale: float, ctm: str) -> np.ndarray:
    """Where in the input (of `n`) each of the `m` outputs of one axis lies, as ONNX's reference maps it."""
    x = np.arange(m, dtype=np.float64)
    width = scale * n  # the reference's float output width, not m
    if ctm == "asymmetric":
        return x / scale
    if ctm == "align_corners":
        return np.zeros(m) if width == 1 else x * (n - 1) / (width - 1)
    if ctm == "pytorch_half_pixel" and width == 1:
        return np.full(m, -0.5)
    offset = n / 2 * (1 - m / width) if ctm == "half_pixel_symmetric" else 0.0
    return offset + (x + 0.5) / scale - 0.5


def nearest_index(n: int, m: int, scale: float, ctm: str, nearest_mode: str) -> np.ndarray:
    """The input index each output of one axis copies."""
    coord = source_coordinates(n, m, scale, ctm)
    low = np.floor(coord)
    frac = coord - low
    between = frac > 0
    if nearest_mode == "round_prefer_floor":
        up = frac > 0.5
    elif nearest_mode == "round_prefer_ceil":
        up = frac >= 0.5
    elif nearest_mode == "ceil":
        up = between
    else:
        up = np.zeros(m, dtype=bool)
    return np.clip(low.astype(np.int64) + (up & between), 0, n - 1)


def linear_matrix(n: int, m: int, scale: float, ctm: str) -> np.ndarray:
    """M [n, m] with resize_1d(v) = v @ M: weight 1 - r on the input below, r on the one above, both clamped."""
    coord = source_coordinates(n, m, scale, ctm)
    low = np.floor(coord)
    frac = coord - low
    below = np.clip(low.astype(np.int64), 0, n - 1)
    above = np.clip(low.astype(np.int64) + 1, 0, n - 1)
    mat = np.zeros((n, m))
    cols = np.arange(m)
    np.add.at(mat, (below, cols), 1 - frac)
    np.add.at(mat, (above, cols), frac)
    return mat


def _repeat_factor(index: np.ndarray) -> tuple[int, int, int] | None:
    """(first, step, repeat) when index[j] = first + step * (j // repeat): whole-factor up- or downsampling."""
    m = len(index)
    repeat = int(np.argmax(index != index[0])) if bool((index != index[0]).any()) else m
    step = int(index[repeat] - index[0]) if repeat < m else 0
    expected = index[0] + step * (np.arange(m) // repeat)
    return (int(index[0]), step, repeat) if m % repeat == 0 and np.array_equal(index, expected) else None


def _nearest_axis(b: Builder, x: str, axis: int, index: np.ndarray) -> str:
    shape = list(b.shape(x))
    factor = _repeat_factor(index)
    if factor is None:
        return b.emit("gather", [x, b.const(index.astype(np.int64), hint="resize_index")], axis=axis)
    first, step, repeat = factor
    out_shape = [*shape[:axis], len(index), *shape[axis + 1:]]
    src, dst = contiguous_strides(tuple(shape)), contiguous_strides(tuple(out_shape))
    # The output axis as (len / repeat, repeat): the outer moves `step` source rows, the inner stays put.
    sizes = [*out_shape[:axis], len(index) // repeat, repeat, *out_shape[axis + 1:]]
    src_strides = [*src[:axis], step * src[axis], 0, *src[axis + 1:]]
    dst_strides = [*dst[:axis], repeat * dst[axis], dst[axis], *dst[axis + 1:]]
    regions = strided_copy_regions(0, first * src[axis], src_strides, 0, dst_strides, sizes)
    return b.emit("raster", [x], regions=regions, shape=out_shape, fill=None)


def _linear_axis(b: Builder, x: str, axis: int, mat: np.ndarray) -> str:
    shape = b.shape(x)
    perm = [d for d in range(len(shape)) if d != axis] + [axis]
    xt = b.emit("transpose", [x], perm=perm)
    flat = b.emit("reshape", [xt], shape=[math.prod(shape[d] for d in perm[:-1]), shape[axis]])
    y = b.emit("matmul", [flat, b.const(mat, b.dtype(x), hint="resize_matrix")])
    y = b.emit("reshape", [y], shape=[shape[d] for d in perm[:-1]] + [mat.shape[1]])
    return b.emit("transpose", [y], perm=[perm.index(d) for d in range(len(shape))])


def _resize(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x = ins[0]
    scales, out = _checked([b.spec(x)], attrs)
    ctm = attrs["coordinate_transformation_mode"]
    for axis, (n, m, scale) in enumerate(zip(b.shape(x), out, scales)):
        if attrs["mode"] == "nearest":
            index = nearest_index(n, m, scale, ctm, attrs["nearest_mode"])
            if m != n or not np.array_equal(index, np.arange(n)):
                x = _nearest_axis(b, x, axis, index)
        else:
            mat = linear_matrix(n, m, scale, ctm)
            if m != n or not np.array_equal(mat, np.eye(n)):
                x = _linear_axis(b, x, axis, mat)
    return [x]


register(OpDef("resize", OpKind.COMPOSITE, _resize_rule, 1, 1, decompose=_resize,
               doc="nearest or linear interpolation to attr shape (ONNX Resize's coordinate modes)"))
