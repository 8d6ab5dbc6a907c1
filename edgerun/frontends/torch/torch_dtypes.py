"""torch dtype <-> edgerun DType."""

from __future__ import annotations

from typing import Any

from edgerun.ir.dtypes import DType

# torch names its types as numpy does. The narrow ones (bfloat16, float8) are storage types in the IR, which
# the torch frontend's ops do not compute on: refused here, with complex.
_NAMES = {d.value: d for d in DType if not d.is_narrow and d is not DType.string}  # torch has no strings


def to_dtype(torch_dtype: Any) -> DType | None:
    """The edgerun DType of a torch dtype, or None when the IR has no equivalent (bfloat16, float8, complex)."""
    return _NAMES.get(str(torch_dtype).removeprefix("torch."))


def to_torch(dtype: DType) -> Any:
    import torch

    return getattr(torch, dtype.value)
