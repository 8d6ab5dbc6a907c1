"""Ops for program state (ir/state.py): writing rows of a persistent tensor at a position known at run time.

`update_slice(x, update, start)` is `x` with `update` written along `axis` from row `start` (an int32/int64
scalar or one-element tensor, clamped like XLA's dynamic_update_slice so the rows always fit): a KV cache's
new entries at the decode position. Raster cannot express it (its regions are static) and the elementwise
form (`where(arange == pos, k, cache)`) rewrites the whole cache. Its reference kernel writes only the
update's rows when its output is its input's buffer, which is how a state update is planned in place
(runtime/state.py).
"""

from __future__ import annotations

from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.ops._rules import norm_axis
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.tensor_spec import TensorSpec


def _update_slice_rule(ins: list[TensorSpec], attrs: dict[str, Any]) -> list[TensorSpec]:
    x, update, start = ins
    if update.dtype is not x.dtype:
        raise ValueError(f"update_slice update is {update.dtype.value}, the tensor is {x.dtype.value}")
    if start.dtype not in (DType.int32, DType.int64) or start.numel != 1:
        raise ValueError(f"update_slice start must be one int32 or int64 value, got {start}")
    axis = norm_axis(int(attrs.get("axis", 0)), x.rank)
    if update.rank != x.rank or any(u != d for i, (u, d) in enumerate(zip(update.shape, x.shape)) if i != axis) \
            or update.shape[axis] > x.shape[axis]:
        raise ValueError(f"update_slice update {update} does not fit {x} along axis {axis}")
    return [x]


register(OpDef("update_slice", OpKind.ATOMIC, _update_slice_rule, 3, 3,
               doc="write rows along axis at a run-time start (clamped to fit): a KV cache's new entries at the "
                   "decode position; in place on a state's buffer, which raster's static regions cannot express"))
