"""Shape-rule helpers shared by the op modules."""

from __future__ import annotations

from collections.abc import Sequence

from edgerun.ir.dtypes import DType
from edgerun.ir.tensor_spec import TensorSpec


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ValueError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def norm_axis(axis: int, rank: int) -> int:
    if not -max(rank, 1) <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


def norm_axes(axes: Sequence[int] | None, rank: int) -> list[int]:
    if axes is None:
        return list(range(rank))
    out = sorted({norm_axis(int(a), rank) for a in axes})
    return out


def same_dtype(specs: Sequence[TensorSpec], op: str) -> DType:
    dtypes = {s.dtype for s in specs}
    if len(dtypes) != 1:
        raise ValueError(f"{op} needs inputs of one dtype, got {sorted(d.value for d in dtypes)}")
    return dtypes.pop()


def require_float(spec: TensorSpec, op: str) -> None:
    if not spec.dtype.is_float:
        raise ValueError(f"{op} needs a float input, got {spec.dtype.value}")
