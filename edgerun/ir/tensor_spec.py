"""TensorSpec: the static type of a value in the graph (shape and element type)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgerun.ir.dtypes import DType


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: DType

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", DType(self.dtype))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.shape))}]"

    def to_json(self) -> dict[str, object]:
        return {"shape": list(self.shape), "dtype": self.dtype.value}

    @staticmethod
    def from_json(d: dict[str, object]) -> TensorSpec:
        return TensorSpec(tuple(d["shape"]), DType(d["dtype"]))  # type: ignore[arg-type]


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides in elements."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)
