"""Shared by the backend tests: one-node graphs, running a graph on a backend, and comparing with reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgerun.backends.base import Backend
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret


def one_node_graph(op: str, inputs: Sequence[np.ndarray], constant: Sequence[bool] = (), **attrs: Any) -> Graph:
    """A graph of one `op` node; inputs flagged in `constant` become constants, the rest graph inputs."""
    g = Graph()
    b = Builder(g)
    names = []
    for k, value in enumerate(inputs):
        if k < len(constant) and constant[k]:
            names.append(g.add_constant(np.asarray(value)))
        else:
            names.append(g.add_input(f"in{k}", TensorSpec(np.shape(value), DType.of(value))))
    g.outputs = [b.emit(op, names, **attrs)]
    return g


def graph_inputs(graph: Graph, values: Sequence[np.ndarray], constant: Sequence[bool] = ()) -> list[np.ndarray]:
    return [v for k, v in enumerate(values) if not (k < len(constant) and constant[k])]


def run_on(backend: Backend, graph: Graph, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    compiled = backend.compile(graph)
    return compiled(*inputs)


def assert_matches_reference(graph: Graph, inputs: Sequence[np.ndarray], got: Sequence[np.ndarray],
                             rtol: float = 1e-5, atol: float = 1e-6) -> None:
    want = interpret(graph, list(inputs), decompose=False)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        else:
            np.testing.assert_array_equal(g, w)


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    want64 = want.astype(np.float64)
    return float(np.abs(got.astype(np.float64) - want64).max() / max(np.abs(want64).max(), 1e-30))
