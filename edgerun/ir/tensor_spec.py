"""TensorSpec: the type of a value in the graph (shape and element type).

A dimension is an int, or a SymDim (an expression over named symbols, `edgerun.ir.symbolic`) in a template
program whose shapes are bound at run time. Static specs hold ints only and behave exactly as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.symbolic import Dim, SymDim, dim_to_json
from edgerun.ir.symbolic_text import dim_from_json


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[Dim, ...]
    dtype: DType

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(d if isinstance(d, SymDim) else int(d) for d in self.shape))
        object.__setattr__(self, "dtype", DType(self.dtype))
        if any(isinstance(d, int) and d < 0 for d in self.shape):
            raise ValueError(f"negative dimension in shape {self.shape}")

    @property
    def is_static(self) -> bool:
        return not any(isinstance(d, SymDim) for d in self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> Dim:
        return math.prod(self.shape)  # type: ignore[return-value]

    @property
    def nbytes(self) -> Dim:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(map(str, self.shape))}]"

    def to_json(self) -> dict[str, object]:
        return {"shape": [dim_to_json(d) for d in self.shape], "dtype": self.dtype.value}

    @staticmethod
    def from_json(d: dict[str, Any]) -> TensorSpec:
        return TensorSpec(tuple(dim_from_json(x) for x in d["shape"]), DType(d["dtype"]))


def contiguous_strides(shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """Row-major strides in elements."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)
