"""torch dtype <-> edgerun DType."""

from __future__ import annotations

from typing import Any

from edgerun.ir.dtypes import DType

# torch names its types as numpy does; the ones outside DType (bfloat16, float8, complex) are refused.
_NAMES = {d.value: d for d in DType}


def to_dtype(torch_dtype: Any) -> DType | None:
    """The edgerun DType of a torch dtype, or None when the IR has no equivalent (bfloat16, float8, complex)."""
    return _NAMES.get(str(torch_dtype).removeprefix("torch."))


def to_torch(dtype: DType) -> Any:
    import torch

    return getattr(torch, dtype.value)
