"""Helpers shared by the pass tests: build small graphs and compare a pass's result with the original."""

from __future__ import annotations

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.ir.verifier import verify
from edgerun.oracle import interpret
from edgerun.passes.decompose_pass import DecomposePass


def graph_with_input(shape: tuple[int, ...], name: str = "x") -> tuple[Graph, Builder, str]:
    graph = Graph()
    x = graph.add_input(name, TensorSpec(shape, DType.float32))
    return graph, Builder(graph), x


def decomposed(graph: Graph) -> Graph:
    return DecomposePass().call(graph.copy()).graph


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(graph.specs[i].shape).astype(graph.specs[i].dtype.np) for i in graph.inputs]


def assert_same_outputs(before: Graph, after: Graph, rtol: float = 0.0, seed: int = 0) -> None:
    """Run both graphs on the same random inputs; rtol 0 means bit-exact. `after` must also verify."""
    verify(after)
    assert after.outputs == before.outputs
    inputs = random_inputs(before, seed)
    for want, got in zip(interpret(before, inputs), interpret(after, inputs)):
        assert got.shape == want.shape and got.dtype == want.dtype
        if rtol == 0.0:
            np.testing.assert_array_equal(got, want)
        else:
            scale = max(float(np.abs(want).max()), 1e-30)
            assert float(np.abs(got - want).max()) <= rtol * scale


def rasters(graph: Graph) -> list:
    return [n for n in graph.nodes if n.op == "raster"]
