"""Backends that cannot compute in float64 or the 16/32/64-bit integer types decline those nodes (the search places
them on another backend) and never crash on them; a graph mixing types still runs, split across backends."""

from __future__ import annotations

import numpy as np
import pytest
from backends_testkit import one_node_graph

from edgerun.backends.base import Backend
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.program import Program
from edgerun.runtime import load

WIDE = [DType.float64, DType.int16, DType.uint16, DType.uint32, DType.uint64]


def _backend(name: str) -> Backend:
    if name == "webgpu":
        pytest.importorskip("wgpu")
        from edgerun.backends.webgpu import WebGpuBackend
        return WebGpuBackend()
    if name == "mnn":
        pytest.importorskip("MNN")
        from edgerun.backends.mnn import MnnBackend
        return MnnBackend(threads=1)
    from edgerun.backends.npu import NpuBackend
    return NpuBackend()


@pytest.mark.parametrize("name", ["webgpu", "mnn", "npu"])
@pytest.mark.parametrize("dtype", WIDE, ids=lambda d: d.value)
def test_backend_declines_every_node_of_a_type_it_cannot_compute(name: str, dtype: DType) -> None:
    backend = _backend(name)
    x = np.arange(6, dtype=dtype.np).reshape(2, 3)
    for op, inputs in [("add", [x, x]), ("mul", [x, x]), ("matmul", [x, x.T.copy()]), ("reduce_sum", [x]),
                       ("cast", [x])]:
        attrs = {"dtype": "float32"} if op == "cast" else {"axes": [1]} if op == "reduce_sum" else {}
        graph = one_node_graph(op, inputs, **attrs)
        assert not backend.supports(graph.nodes[0], graph), (name, op, dtype)


def _mixed_graph() -> Graph:
    """float32 -> relu -> cast to float64 -> add a float64 weight -> multiply: the float32 part can go to a
    float32 backend, the float64 part cannot."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((2, 4), DType.float32))
    w = g.add_constant(np.full((2, 4), 1e-12, np.float64), name="w")
    y = b.emit("cast", [b.emit("relu", [b.emit("mul", [x, x])])], dtype="float64")
    g.outputs = [b.emit("mul", [b.emit("add", [y, w]), y])]
    return g


def test_webgpu_runs_the_float32_part_and_leaves_float64_to_the_reference(tmp_path) -> None:
    pytest.importorskip("wgpu")
    from edgerun.backends.webgpu import get_device
    from edgerun.errors import BackendUnavailableError
    try:
        get_device()
    except BackendUnavailableError as exc:
        pytest.skip(f"no WebGPU adapter: {exc}")
    graph = _mixed_graph()
    path = tmp_path / "mixed.edgr"
    Program(graph).save(path)
    program = Program.read(path)
    assert program.graph.constants["w"].dtype == np.float64
    loaded = load(program, backends=["webgpu"])
    placed = {n.op: p.backend for p in loaded.parts.partitions for n in p.subgraph(loaded.parts.graph).nodes}
    assert placed["add"] == "reference", placed  # the float64 add: webgpu declined it
    assert placed["maximum"] == "webgpu", placed  # relu's float32 maximum: it still took what it can run
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(2, 4)
    got = loaded(x)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, interpret(graph, [x])[0])
