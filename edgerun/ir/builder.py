"""Builder: emits nodes into a graph with their output specs inferred by the registry.

Decompositions, frontends and passes all build graphs through it, so shape rules are applied in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.registry import infer_specs
from edgerun.ir.symbolic import fixed_by_bounds
from edgerun.ir.tensor_spec import TensorSpec


class Builder:
    def __init__(self, graph: Graph, meta: dict[str, str] | None = None) -> None:
        self.graph = graph
        self.meta = dict(meta or {})  # copied onto every node emitted, so errors still name their source

    def spec(self, value: str) -> TensorSpec:
        return self.graph.specs[value]

    def shape(self, value: str) -> tuple[int, ...]:
        return self.graph.specs[value].shape

    def dtype(self, value: str) -> DType:
        return self.graph.specs[value].dtype

    def const(self, data: Any, dtype: DType | str | None = None, hint: str = "const") -> str:
        """A constant; without `dtype`, float64 data (Python floats, numpy's default) is stored as float32, the
        type handlers compute in. A float64 constant needs `dtype=DType.float64`."""
        arr = np.asarray(data)
        if dtype is not None:
            with np.errstate(all="ignore"):  # as numpy's astype: a Python int out of range wraps
                arr = arr.astype(DType(dtype).np, copy=False)
        if dtype is None and arr.dtype == np.float64:
            arr = arr.astype(np.float32)
        return self.graph.add_constant(arr, hint=hint)

    def scalar(self, value: float | int | bool, like: str) -> str:
        """A 0-d constant with the dtype of `like` (broadcasts against it)."""
        return self.const(value, self.dtype(like))

    def emit_multi(self, op: str, inputs: list[str], **attrs: Any) -> list[str]:
        specs = infer_specs(op, [self.graph.specs[i] if i else _ABSENT for i in inputs], attrs,
                            self.graph.subgraphs)
        if self.graph.symbols:
            specs = [fixed_spec(s, self.graph.symbols) for s in specs]
        return self.graph.add_node(op, inputs, specs, attrs, self.meta)

    def emit(self, op: str, inputs: list[str], **attrs: Any) -> str:
        outs = self.emit_multi(op, inputs, **attrs)
        if len(outs) != 1:
            raise ValueError(f"{op} has {len(outs)} outputs; use emit_multi")
        return outs[0]

    # Shorthands used throughout the decompositions.
    def unary(self, op: str, x: str) -> str:
        return self.emit(op, [x])

    def binary(self, op: str, a: str, b: str) -> str:
        return self.emit(op, [a, b])


def fixed_spec(spec: TensorSpec, symbols: Mapping[str, tuple[int, int]]) -> TensorSpec:
    """`spec` with each dimension the symbols' bounds fix written as that number: a pool's `(H + 15)//48` is 1
    for every H in 33..80, so a Reshape after it to [N, 1, W] is proved over those bounds, one plan. The
    verifier infers specs the same way."""
    shape = tuple(fixed_by_bounds(d, symbols) for d in spec.shape)
    return spec if shape == spec.shape else dataclasses.replace(spec, shape=shape)


# Placeholder spec for an omitted optional input; shape rules check `is _ABSENT` via `absent()`.
_ABSENT = TensorSpec((), DType.bool)


def absent(spec: TensorSpec) -> bool:
    return spec is _ABSENT
