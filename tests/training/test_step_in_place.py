"""A train step's weight and moment updates are written over their own state buffers on ONNX Runtime (no
copy after the call), the weight gradients come out in the weights' layout (no transposed product), and
the step still equals the reference backend's, skipped steps included."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import edgerun.training as T
from edgerun.backends.onnxruntime import build_model
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.region import Region
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle.interpreter import interpret
from edgerun.passes.raster_merge_pass import RasterMergePass
from edgerun.passes.transposed_matmul import swap_transposed_products, transpose_source
from edgerun.zoo.mlp import MLP


def _states(model: T.TrainingProgram) -> dict[str, np.ndarray]:
    return {name: np.array(value) for name, value in model.loaded.state.items()}


def _transpose(b: Builder, value: str) -> str:
    rows, cols = b.shape(value)
    return b.emit("raster", [value], shape=[cols, rows], fill=None,
                  regions=[Region(0, 0, (0, 1, cols), 0, (0, rows, 1), (1, cols, rows)).to_list()])


@pytest.mark.parametrize("optimizer", [T.SGD(0.05, momentum=0.9, weight_decay=1e-3), T.Adam(1e-2, weight_decay=1e-3)],
                         ids=["sgd-momentum", "adam"])
def test_updates_are_written_in_place_and_equal_the_reference(optimizer) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    module = MLP(64, 32, 10).eval()
    x = torch.rand(8, 1, 8, 8)
    y = torch.randint(0, 10, (8,))
    ort = T.from_torch(module, (x,), optimizer=optimizer, backends=["onnxruntime"])
    ref = T.from_torch(module, (x,), optimizer=optimizer, backends=["reference"])
    plan = ort.loaded.method("train_step").parts.state.plan
    assert plan.copies == () and len(plan.in_place) == len(ort.program.state)
    bad = x.numpy().copy()
    bad[0, 0, 0, 0] = np.inf
    for step in range(4):
        batch = bad if step == 2 else x.numpy()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            before = _states(ort) if step == 2 else None
            ort.train_step(batch, y.numpy())
            ref.train_step(batch, y.numpy())
        if before is not None:  # the skipped step left every state (weights and moments) exactly as it was
            after = _states(ort)
            assert all(np.array_equal(before[k], after[k]) for k in before)
    assert ort.skipped_steps == ref.skipped_steps == 1 and ort.steps == 3
    ours, theirs = _states(ort), _states(ref)
    for name in ours:
        np.testing.assert_allclose(ours[name], theirs[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_transposed_product_becomes_the_product_of_the_transposes() -> None:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((6, 5), DType.float32))
    dy = g.add_input("dy", TensorSpec((6, 4), DType.float32))
    out = _transpose(b, b.emit("matmul", [_transpose(b, x), dy]))  # (x^T dy)^T, as a weight's gradient comes
    g.outputs = [out]
    rng = np.random.default_rng(0)
    xv, dyv = rng.standard_normal((6, 5), np.float32), rng.standard_normal((6, 4), np.float32)
    assert swap_transposed_products(g) == 1
    g = RasterMergePass().call(g).graph
    (got,) = interpret(g, {"x": xv, "dy": dyv})
    np.testing.assert_allclose(got, dyv.T @ xv, rtol=1e-6)
    # one matmul of dy^T and x itself: no transpose of x, none of the [5, 4] product
    producers = g.producers()
    assert [n.op for n in g.nodes].count("matmul") == 1 and producers[out].op == "matmul"
    assert all(transpose_source(g, n) in (None, "dy") for n in g.nodes)


def test_onnx_runtime_reads_a_transposed_operand_through_gemm() -> None:
    g = Graph()
    b = Builder(g)
    a = g.add_input("a", TensorSpec((3, 4), DType.float32))
    w = g.add_input("w", TensorSpec((5, 4), DType.float32))
    g.outputs = [b.emit("matmul", [a, _transpose(b, w)])]
    model, _ = build_model(g)
    ops = [n.op_type for n in model.graph.node]
    assert "Transpose" not in ops and ops.count("Gemm") == 1
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    assert {at.name: at.i for at in gemm.attribute} == {"transA": 0, "transB": 1}
    from edgerun.backends.onnxruntime import create_backend

    compiled = create_backend(threads=1).compile(g)
    rng = np.random.default_rng(1)
    av, wv = rng.standard_normal((3, 4), np.float32), rng.standard_normal((5, 4), np.float32)
    (got,) = compiled(av, wv)
    np.testing.assert_allclose(got, av @ wv.T, rtol=1e-5)
