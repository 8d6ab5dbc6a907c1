"""The element types a tensor may have, and their numpy equivalents (numpy is the runtime's only dependency)."""

from __future__ import annotations

import builtins
from enum import StrEnum

import numpy as np


class DType(StrEnum):
    float32 = "float32"
    float16 = "float16"
    int8 = "int8"
    uint8 = "uint8"
    int32 = "int32"
    int64 = "int64"
    bool = "bool"

    @property
    def np(self) -> np.dtype:
        return np.dtype(self.value)

    @property
    def itemsize(self) -> int:
        return int(self.np.itemsize)

    @property
    def is_float(self) -> builtins.bool:
        return self in (DType.float32, DType.float16)

    @property
    def is_int(self) -> builtins.bool:
        return self in (DType.int8, DType.uint8, DType.int32, DType.int64)

    @staticmethod
    def of(x: object) -> DType:
        """The DType of a numpy dtype, array, or dtype name; raises ValueError for anything else."""
        name = np.dtype(x.dtype if hasattr(x, "dtype") else x).name  # type: ignore[arg-type, attr-defined]
        try:
            return DType(name)
        except ValueError:
            raise ValueError(f"dtype {name!r} is not one of {[d.value for d in DType]}") from None


def promote(a: DType, b: DType) -> DType:
    """Result type of a binary op on two tensors (numpy's rule restricted to our dtypes)."""
    return DType.of(np.promote_types(a.np, b.np))
