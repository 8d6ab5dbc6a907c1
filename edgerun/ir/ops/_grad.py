"""Helpers shared by the gradient rules (registry.GradientRule): broadcasting undone, sizes, transposes."""

from __future__ import annotations

from collections.abc import Sequence

from edgerun.ir.builder import Builder


def unbroadcast(b: Builder, g: str, shape: Sequence[int]) -> str:
    """`g` summed over the axes broadcasting added or stretched, so it has `shape` (the operand's)."""
    shape = tuple(shape)
    gshape = b.shape(g)
    if gshape == shape:
        return g
    lead = len(gshape) - len(shape)
    axes = list(range(lead)) + [lead + i for i, d in enumerate(shape) if d == 1 and gshape[lead + i] != 1]
    if axes:
        g = b.emit("reduce_sum", [g], axes=axes, keepdims=True)
    if b.shape(g) != shape:
        g = b.emit("reshape", [g], shape=list(shape))
    return g


def reshape_to(b: Builder, x: str, shape: Sequence[int]) -> str:
    return x if b.shape(x) == tuple(shape) else b.emit("reshape", [x], shape=list(shape))


def expand_to(b: Builder, x: str, shape: Sequence[int]) -> str:
    return x if b.shape(x) == tuple(shape) else b.emit("expand", [x], shape=list(shape))


def swap_last(b: Builder, x: str) -> str:
    """x with its last two axes swapped."""
    rank = len(b.shape(x))
    perm = [*range(rank - 2), rank - 1, rank - 2]
    return b.emit("transpose", [x], perm=perm)


def as_float(b: Builder, mask: str, like: str) -> str:
    """A bool mask as 0/1 in `like`'s dtype."""
    return b.emit("cast", [mask], dtype=b.dtype(like).value)


def kept_reduction(b: Builder, g: str, in_shape: Sequence[int], axes: Sequence[int] | None, keepdims: bool) -> str:
    """A reduction's cotangent reshaped so it broadcasts against the reduction's input (keepdims form)."""
    rank = len(in_shape)
    axes_set = set(range(rank)) if axes is None else {int(a) % max(rank, 1) for a in axes}
    kept = [1 if i in axes_set else d for i, d in enumerate(in_shape)]
    return reshape_to(b, g, kept) if not keepdims or b.shape(g) != tuple(kept) else g
