"""Strided views of a flat source as ONNX: Reshape into nested blocks, stepped Slices, Transpose, and a
reversing Slice or Expand for negative and zero strides. Shared by the raster readings (onnx_raster.py)."""

from __future__ import annotations

import math
from itertools import pairwise

import numpy as np

from edgerun.backends.onnxruntime.onnx_ops import OnnxBuilder

INT64_MIN = np.iinfo(np.int64).min


def view_fits(src_numel: int, offset: int, dims: list[tuple[int, int]]) -> bool:
    """Whether strided_view can express src.flat[offset + sum(i_k * stride_k)] over `dims` (count, stride)."""
    moving = sorted(((abs(s), n) for n, s in dims if s != 0), reverse=True)
    if len({s for s, _ in moving}) != len(moving):
        return False
    if not moving:
        return True
    for n, s in dims:
        if s < 0:
            offset += s * (n - 1)
    return nested_layout(src_numel, offset, [s for s, _ in moving], [n for _, n in moving]) is not None


def strided_view(b: OnnxBuilder, src: str, src_numel: int, offset: int,
                  dims: list[tuple[int, int]]) -> str | None:
    """A value of shape [n for n, _ in dims] holding src.flat[offset + sum(i_k * stride_k)], or None."""
    shape = [n for n, _ in dims]
    reversed_axes = []
    moving: list[tuple[int, int, int]] = []  # (axis, n, positive stride)
    for axis, (n, s) in enumerate(dims):
        if s < 0:
            offset += s * (n - 1)
            reversed_axes.append(axis)
        if s != 0:
            moving.append((axis, n, abs(s)))
    order = sorted(range(len(moving)), key=lambda k: -moving[k][2])
    strides = [moving[k][2] for k in order]
    counts = [moving[k][1] for k in order]
    if len(set(strides)) != len(strides):
        return None
    flat = b.node("Reshape", [src, b.ints([-1])])
    if not moving:  # one element (a one-element source is that element: no Slice)
        view = flat if src_numel == 1 else b.node("Slice", [flat, b.ints([offset]), b.ints([offset + 1]), b.ints([0])])
    else:
        nested = nested_slice(b, flat, src_numel, offset, strides, counts)
        if nested is None:
            return None
        view = nested
        inverse = [0] * len(order)
        for pos, k in enumerate(order):
            inverse[k] = pos
        if inverse != sorted(inverse):
            view = b.node("Transpose", [view], perm=inverse)
    if reversed_axes:
        moving_pos = {axis: pos for pos, (axis, _, _) in enumerate(moving)}
        axes = [moving_pos[a] for a in reversed_axes]
        view = b.node("Slice", [view, b.ints([-1] * len(axes)), b.ints([INT64_MIN] * len(axes)), b.ints(axes),
                                b.ints([-1] * len(axes))])
    if len(moving) != len(dims):
        broadcastable = [n if s != 0 else 1 for n, s in dims]
        view = b.node("Reshape", [view, b.ints(broadcastable)])
        return b.node("Expand", [view, b.ints(shape)])
    return b.node("Reshape", [view, b.ints(shape)])


def nested_layout(src_numel: int, offset: int, strides: list[int], counts: list[int]) \
        -> tuple[list[int], list[int], list[int], list[int], int] | None:
    """Block sizes B0 = s0 and Bk = gcd(sk, Bk-1), so dimension k walks its block with step sk / Bk; the
    view fits when every dimension's last index stays inside its block. (shape, starts, ends, steps, q0)."""
    blocks = [strides[0]]
    for stride in strides[1:]:
        blocks.append(math.gcd(stride, blocks[-1]))
    q0, rem = divmod(offset, blocks[0])
    if offset + sum((n - 1) * st for n, st in zip(counts, strides)) >= src_numel:
        return None  # the view leaves the source (the last block may still be partial: padded below)
    shape = [counts[0]] + [big // small for big, small in pairwise(blocks)] + [blocks[-1]]
    starts, ends, steps = [0], [counts[0]], [1]
    for k in range(1, len(strides)):
        digit, rem = divmod(rem, blocks[k])
        step = strides[k] // blocks[k]
        end = digit + (counts[k] - 1) * step + 1
        if end > shape[k]:
            return None
        starts.append(digit)
        ends.append(end)
        steps.append(step)
    starts.append(rem)
    ends.append(rem + 1)
    steps.append(1)
    return shape, starts, ends, steps, q0


def nested_slice(b: OnnxBuilder, flat: str, src_numel: int, offset: int, strides: list[int],
                  counts: list[int]) -> str | None:
    """Reshape the flat source into nested blocks and slice (with steps) each digit of `offset` out of it."""
    layout = nested_layout(src_numel, offset, strides, counts)
    if layout is None:
        return None
    shape, starts, ends, steps, q0 = layout
    block = strides[0]
    view = flat
    if q0 != 0 or counts[0] * block != src_numel:
        view = b.node("Slice", [flat, b.ints([q0 * block]), b.ints([(q0 + counts[0]) * block]), b.ints([0])])
    short = (q0 + counts[0]) * block - src_numel
    if short > 0:  # the last block runs past the source's end, only into elements the view skips
        view = b.node("Pad", [view, b.ints([0, short], "pads")], mode="edge")
    view = b.node("Reshape", [view, b.ints(shape)])
    cut = [k for k in range(len(shape)) if starts[k] != 0 or ends[k] != shape[k] or steps[k] != 1]
    if cut:
        view = b.node("Slice", [view, b.ints([starts[k] for k in cut]), b.ints([ends[k] for k in cut]),
                                b.ints(cut), b.ints([steps[k] for k in cut])])
    return b.node("Reshape", [view, b.ints(counts)])
