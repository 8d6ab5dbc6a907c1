"""The element types a tensor may have, and their numpy equivalents (numpy is the runtime's only dependency).

Every numpy-native numeric type is here. bfloat16, float8, int4 and complex types are not: numpy has no
bfloat16/float8/int4 (ml_dtypes would be needed, a dependency the runtime does not take), and no op or backend
computes on complex values; strings are not tensors of numbers."""

from __future__ import annotations

import builtins
from enum import StrEnum

import numpy as np


class DType(StrEnum):
    float32 = "float32"
    float16 = "float16"
    float64 = "float64"
    int8 = "int8"
    uint8 = "uint8"
    int16 = "int16"
    uint16 = "uint16"
    int32 = "int32"
    uint32 = "uint32"
    int64 = "int64"
    uint64 = "uint64"
    bool = "bool"

    @property
    def np(self) -> np.dtype:
        return np.dtype(self.value)

    @property
    def itemsize(self) -> int:
        return int(self.np.itemsize)

    @property
    def is_float(self) -> builtins.bool:
        return self in (DType.float32, DType.float16, DType.float64)

    @property
    def is_int(self) -> builtins.bool:
        return self.is_signed_int or self.is_unsigned_int

    @property
    def is_signed_int(self) -> builtins.bool:
        return self in (DType.int8, DType.int16, DType.int32, DType.int64)

    @property
    def is_unsigned_int(self) -> builtins.bool:
        return self in (DType.uint8, DType.uint16, DType.uint32, DType.uint64)

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
