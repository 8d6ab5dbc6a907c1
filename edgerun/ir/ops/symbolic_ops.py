"""dim_value: a size as a 0-d tensor, for models that compute with their own shapes (x / seq, index wraps).

In a template program the size is a symbolic expression whose value is only known per call; the op keeps
it as an attribute, and specialisation substitutes the value. It is a composite whose decomposition is a
constant, so it never reaches a backend: by the time the runtime places nodes, it is one number.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.symbolic import as_dim
from edgerun.ir.tensor_spec import TensorSpec


def _dim_value_rule(ins: list[TensorSpec], attrs: dict[str, Any]) -> list[TensorSpec]:
    as_dim(attrs["value"])  # an int or a SymDim, nothing else
    return [TensorSpec((), DType(attrs.get("dtype", "int64")))]


def _dim_value(b: Builder, ins: list[str], attrs: dict[str, Any]) -> list[str]:
    dtype = DType(attrs.get("dtype", "int64"))
    return [b.const(np.asarray(int(as_dim(attrs["value"]))), dtype)]


register(OpDef("dim_value", OpKind.COMPOSITE, _dim_value_rule, 0, 0, decompose=_dim_value,
               doc="a size (attr value: an int or a symbolic dimension) as a 0-d tensor of attr dtype; "
                   "a constant once a template program is specialised"))
