"""torch dtype <-> edgerun DType."""

from __future__ import annotations

from typing import Any

from edgerun.ir.dtypes import DType

_NAMES = {"float32": DType.float32, "float16": DType.float16, "int8": DType.int8, "uint8": DType.uint8,
          "int32": DType.int32, "int64": DType.int64, "bool": DType.bool}


def to_dtype(torch_dtype: Any) -> DType | None:
    """The edgerun DType of a torch dtype, or None when the IR has no equivalent (float64, bfloat16, complex)."""
    return _NAMES.get(str(torch_dtype).removeprefix("torch."))


def to_torch(dtype: DType) -> Any:
    import torch

    return getattr(torch, dtype.value)
