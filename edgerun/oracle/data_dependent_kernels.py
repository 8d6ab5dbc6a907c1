"""Reference kernels of the data-dependent ops (ir/ops/data_dependent_ops.py).

Unlike KERNELS, each returns fresh arrays: its output extent is what it computes, so nothing can be
allocated for it beforehand. The staged run (interpreter.py, runtime/staged.py) calls these between the
program's stages; no backend runs them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.oracle.image_kernels import IMAGE_DATA_DEPENDENT_KERNELS
from edgerun.oracle.string_kernels import STRING_DATA_DEPENDENT_KERNELS

DataDependentKernel = Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]


def _nonzero(args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = args[0]
    return [np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1)]


def _unique(args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """numpy.unique's sorted result; with sorted=0 reordered by first occurrence (as ONNX specifies)."""
    x = args[0]
    axis = attrs.get("axis")
    source = x.reshape(-1) if axis is None else x
    axis = 0 if axis is None else int(axis) % x.ndim
    y, first, inverse, counts = np.unique(source, return_index=True, return_inverse=True, return_counts=True,
                                          axis=axis)
    inverse = np.asarray(inverse).reshape(-1)
    if not attrs.get("sorted", True):
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        first, counts, inverse = first[order], counts[order], rank[inverse]
        y = np.take(source, first, axis=axis)
    return [np.ascontiguousarray(y), first.astype(np.int64), inverse.astype(np.int64), counts.astype(np.int64)]


def _top_k(args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """The k largest (or smallest) along the axis, sorted, ties to the lower index (ONNX TopK)."""
    x, k = args[0], int(args[1].reshape(-1)[0])
    axis = int(attrs.get("axis", -1)) % x.ndim
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise EdgerunError(f"top_k: k={k} is outside [0, {n}] (the axis length)")
    if attrs.get("largest", True):  # a stable ascending sort of the reversed axis, reversed: ties keep index order
        order = n - 1 - np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    index = np.take(order, np.arange(k), axis=axis).astype(np.int64)
    return [np.take_along_axis(x, index, axis), index]


def _iou_suppresses(a: np.ndarray, b: np.ndarray, center: bool, threshold: float) -> bool:
    """ONNX's suppress_by_iou: whether box `b`, already selected, suppresses box `a`."""
    if center:
        ax0, ax1 = a[0] - a[2] / 2, a[0] + a[2] / 2
        bx0, bx1 = b[0] - b[2] / 2, b[0] + b[2] / 2
        ay0, ay1 = a[1] - a[3] / 2, a[1] + a[3] / 2
        by0, by1 = b[1] - b[3] / 2, b[1] + b[3] / 2
    else:  # corners [y1, x1, y2, x2], either order
        ax0, ax1 = sorted((a[1], a[3]))
        bx0, bx1 = sorted((b[1], b[3]))
        ay0, ay1 = sorted((a[0], a[2]))
        by0, by1 = sorted((b[0], b[2]))
    ix0, ix1, iy0, iy1 = max(ax0, bx0), min(ax1, bx1), max(ay0, by0), min(ay1, by1)
    if ix1 <= ix0 or iy1 <= iy0:
        return False
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a, area_b = (ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0)
    union = area_a + area_b - inter
    if inter <= 0 or area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return bool(inter / union > threshold)


def _scalar(args: list[np.ndarray], i: int) -> Any:
    return args[i].reshape(-1)[0] if len(args) > i and args[i].size else None


def _non_max_suppression(args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    """ONNX NonMaxSuppression: per batch and class, boxes by descending score (ties: lower index first),
    each kept unless a kept one overlaps it by more than the IoU threshold, at most max-per-class kept."""
    boxes, scores = args[0], args[1]
    if boxes.shape[2] != 4 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise EdgerunError(f"non_max_suppression takes boxes [batch, boxes, 4] and scores [batch, classes, boxes], "
                           f"got {list(boxes.shape)} and {list(scores.shape)}")
    limit = max(int(_scalar(args, 2) or 0), 0)
    iou = _scalar(args, 3)
    iou = 0.0 if iou is None else iou
    score_threshold = _scalar(args, 4)
    center = bool(attrs.get("center_point_box", 0))
    selected: list[tuple[int, int, int]] = []
    for batch in range(boxes.shape[0]):
        for cls in range(scores.shape[1]):
            row = scores[batch, cls]
            candidates = np.arange(row.shape[0]) if score_threshold is None else np.nonzero(row > score_threshold)[0]
            order = candidates[np.lexsort((candidates, -row[candidates]))]
            kept: list[int] = []
            for box in order:
                if len(kept) >= limit:
                    break
                if not any(_iou_suppresses(boxes[batch, box], boxes[batch, k], center, iou) for k in kept):
                    kept.append(int(box))
                    selected.append((batch, cls, int(box)))
    return [np.array(selected, dtype=np.int64).reshape(-1, 3)]


DATA_DEPENDENT_KERNELS: dict[str, DataDependentKernel] = {
    "nonzero": _nonzero,
    "unique": _unique,
    "top_k_dynamic": _top_k,
    "non_max_suppression": _non_max_suppression,
    **STRING_DATA_DEPENDENT_KERNELS,  # string_split, string_normalize (oracle/string_kernels.py)
    **IMAGE_DATA_DEPENDENT_KERNELS,  # image_decode (oracle/image_kernels.py)
}
