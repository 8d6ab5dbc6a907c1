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


def _f64(*shape: int, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    return np.random.default_rng(len(shape) * 7 + shape[0]).uniform(low, high, shape)


# Every op ONNX Runtime's delegate claims in float64 (its NUMERIC and FLOATS declarations), one case each.
ORT_FLOAT64 = [
    *[(op, [_f64(3, 1, 4), _f64(5, 4)], {}) for op in ("add", "sub", "mul", "maximum", "minimum")],
    *[(op, [_f64(4, 3)], {}) for op in ("neg", "abs", "sign")],
    *[(op, [np.round(_f64(2, 6)), np.round(_f64(6))], {}) for op in ("eq", "ne", "lt", "le", "gt", "ge")],
    *[(op, [_f64(3, 4, 5)], {"axes": [1], "keepdims": True}) for op in ("reduce_sum", "reduce_max", "reduce_min",
                                                                         "reduce_mean")],
    ("argmax", [_f64(4, 6)], {"axis": 1}),
    ("where", [_f64(3, 4) > 0, _f64(3, 4), _f64(4)], {}),
    ("matmul", [_f64(2, 1, 3, 4), _f64(5, 4, 6)], {}),
    ("cast", [_f64(6) * 1e10], {"dtype": "float32"}),
    ("cast", [_f64(6).astype(np.float32)], {"dtype": "float64"}),
]


@pytest.mark.parametrize("op,inputs,attrs", ORT_FLOAT64, ids=[f"{c[0]}-{k}" for k, c in enumerate(ORT_FLOAT64)])
def test_onnxruntime_claims_float64_ops_and_matches_the_reference(op: str, inputs: list[np.ndarray],
                                                                   attrs: dict) -> None:
    pytest.importorskip("onnxruntime")
    from edgerun.backends.onnxruntime import OnnxRuntimeBackend
    ort = OnnxRuntimeBackend(threads=1)
    graph = one_node_graph(op, inputs, **attrs)
    assert ort.supports(graph.nodes[0], graph), op
    got = ort.compile(graph)(*inputs)
    want = interpret(graph, inputs)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-14, atol=1e-15)
