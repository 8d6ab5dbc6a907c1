"""int8-static with static_linear: linear layers stay integer to their uint8 output (QLinearMatMul's form),
and the ONNX Runtime delegate runs matmul_integer + requantize(float32) as one bit-exact QLinearMatMul."""

from __future__ import annotations

import numpy as np
import pytest

import edgerun
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.program import Program
from edgerun.quantization.flow import quantize_with_report

RNG = np.random.default_rng(0)
F = np.float32


def _mlp(bias: bool, seed: int = 0) -> Program:
    """x (2, 3, 16) -> linear 32 -> relu -> linear 32 -> linear 8: batched 3-D input, as a transformer's MLP."""
    rng = np.random.default_rng(seed)
    g = Graph()
    b = Builder(g)
    h = g.add_input("x", TensorSpec((2, 3, 16), DType.float32))
    for k, (cin, cout) in enumerate([(16, 32), (32, 32), (32, 8)]):
        h = b.emit("matmul", [h, b.const((rng.standard_normal((cin, cout)) / np.sqrt(cin)).astype(F))])
        if bias:
            h = b.emit("add", [h, b.const(rng.standard_normal(cout).astype(F) * 0.1)])
        if k == 0:
            h = b.emit("relu", [h])
    g.outputs = [h]
    return Program(graph=g)


def _calibration(n: int, seed: int) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((n, 2, 3, 16)).astype(F)}


def _sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got.astype(np.float64)) ** 2)))


def test_static_linear_layers_requantize_with_the_bias_in_int32_and_the_relu_folded() -> None:
    program = _mlp(bias=True)
    calibration = _calibration(8, seed=1)
    q, report = quantize_with_report(program, "int8-static", calibration=calibration, static_linear=True)
    counts = q.graph.op_counts()
    # layers 1 and 2 requantize (their readers are layers); layer 3 is the graph output: dequantized, float bias
    assert counts["matmul_integer"] == 3 and counts["requantize"] == 2 and counts["quantize_linear"] == 1
    assert "relu" not in counts and "dynamic_quantize" not in counts and "matmul" not in counts
    adds = [n for n in q.graph.nodes if n.op == "add"]
    assert sorted(str(q.graph.specs[n.outputs[0]].dtype.value) for n in adds) == ["float32", "int32", "int32"]
    for node in q.graph.nodes:
        if node.op == "requantize":
            assert node.attrs["arithmetic"] == "float32" and q.graph.specs[node.outputs[0]].dtype is DType.uint8
            assert q.graph.constants[node.inputs[1]].shape == (32,)  # per column: the weights' per-channel scales
    integer_readers = [n.op for r in q.graph.nodes if r.op == "requantize" for n in q.graph.nodes if r.outputs[0] in n.inputs]
    assert integer_readers == ["matmul_integer", "matmul_integer"]  # the next layer reads the uint8 value directly
    relu_out = program.graph.nodes[2].outputs[0]
    assert q.metadata["quantization"]["uint8_values"][relu_out]["zero_point"] == 0  # ReLU folded: range from 0
    assert len(report.layers) == 3 and all(r.sqnr_db > 30 for r in report.layers)
    x = calibration["x"][0]  # inside the calibrated ranges: what is left is rounding
    assert _sqnr(interpret(program.graph, [x])[0], interpret(q.graph, [x])[0]) > 30


def test_a_linear_bias_read_by_more_than_the_layer_stays_float() -> None:
    """The bias add is folded only when it is the matmul's only reader; otherwise the matmul's own result
    requantizes and the add stays float, on the dequantized value."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((4, 16), DType.float32))
    y = b.emit("matmul", [x, b.const(RNG.standard_normal((16, 16)).astype(F) / 4)])
    z = b.emit("add", [y, b.const(RNG.standard_normal(16).astype(F))])
    w = b.emit("matmul", [b.emit("mul", [y, z]), b.const(RNG.standard_normal((16, 4)).astype(F) / 4)])
    g.outputs = [w]
    program = Program(graph=g)
    q = edgerun.quantize(program, "int8-static", calibration={"x": RNG.standard_normal((4, 4, 16)).astype(F)},
                         static_linear=True)
    adds = [q.graph.specs[n.outputs[0]].dtype for n in q.graph.nodes if n.op == "add"]
    assert adds == [DType.float32] and q.graph.op_counts()["requantize"] == 1
    xs = RNG.standard_normal((4, 16)).astype(F) * 0.5
    assert _sqnr(interpret(program.graph, [xs])[0], interpret(q.graph, [xs])[0]) > 25


ort = pytest.importorskip("onnxruntime")  # the rest runs the delegate

from edgerun.backends.onnxruntime import OnnxRuntimeBackend, build_model  # noqa: E402
from edgerun.runtime.loader import load  # noqa: E402

ORT = OnnxRuntimeBackend(threads=1)


def _q(dtype: type, *shape: int, lo: int | None = None, hi: int | None = None) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(dtype)


def _qlinear_matmul_graph(x_shape: tuple[int, ...], n: int, w_dtype: type, per_column: bool, bias: bool
                          ) -> tuple[Graph, np.ndarray]:
    """uint8 x -> matmul_integer (7-bit int8 or full-range uint8 weights) [+ int32 bias] -> requantize(float32):
    one QLinearMatMul, or with the bias one QGemm."""
    g = Graph()
    b = Builder(g)
    k = x_shape[-1]
    x = g.add_input("x", TensorSpec(x_shape, DType.uint8))
    if w_dtype is np.int8:
        w, w_zp = _q(np.int8, k, n, lo=-63, hi=63), np.zeros((), np.int8)
    else:
        w, w_zp = _q(np.uint8, k, n), np.array(119, np.uint8)
    acc = b.emit("matmul_integer", [x, b.const(w), b.const(np.array(121, np.uint8)), b.const(w_zp)])
    xs = _q(np.uint8, *x_shape)
    exact = (xs.astype(np.int64) - 121) @ (w.astype(np.int64) - w_zp)
    if bias:
        acc = b.emit("add", [acc, b.const(_q(np.int32, n, lo=-int(exact.std()), hi=int(exact.std())))])
    spread = np.std(exact)  # outputs over ~+-100, some saturating
    scale = (60 / spread * (RNG.random(n if per_column else ()) + 0.5)).astype(F)
    g.outputs = [b.emit("requantize", [acc, b.const(scale), b.const(np.array(97, np.uint8))], arithmetic="float32")]
    return g, xs


SHAPES = [((6, 64), 5, np.int8, True), ((1, 33), 17, np.int8, False), ((2, 7, 48), 24, np.int8, True),
          ((3, 4, 40), 9, np.uint8, True), ((2, 2, 5, 32), 16, np.uint8, False)]
SHAPE_IDS = ["2d-per-column", "one-row-per-tensor", "batched-3d", "u8-weights-3d", "batched-4d-per-tensor"]


@pytest.mark.parametrize("bias", [False, True], ids=["qlinearmatmul", "bias-qgemm"])
@pytest.mark.parametrize("x_shape,n,w_dtype,per_column", SHAPES, ids=SHAPE_IDS)
def test_matmul_requantize_chain_runs_as_one_bit_exact_qlinearmatmul(x_shape: tuple[int, ...], n: int, w_dtype: type,
                                                                     per_column: bool, bias: bool) -> None:
    graph, x = _qlinear_matmul_graph(x_shape, n, w_dtype, per_column, bias)
    assert all(ORT.supports(node, graph) for node in graph.nodes)
    model, _ = build_model(graph)
    assert [node.op_type for node in model.graph.node if node.op_type != "Reshape"] == ["QGemm" if bias else "QLinearMatMul"]
    got, want = ORT.compile(graph)(x)[0], interpret(graph, [x], decompose=False)[0]
    assert got.dtype == np.uint8 and len(np.unique(want)) > 10 and np.array_equal(got, want)


def test_static_linear_mlp_runs_as_qlinearmatmuls_wholly_on_ort_and_bit_exactly() -> None:
    """Bias-free linear layers: each that feeds another is one QLinearMatMul; the last (the graph output)
    is MatMulInteger + DequantizeLinear. The whole program on ORT equals the reference bit for bit."""
    q = edgerun.quantize(_mlp(bias=False), "int8-static", calibration=_calibration(8, seed=1), static_linear=True,
                         reduce_range=True)
    ops = [node.op_type for node in build_model(q.graph)[0].graph.node]
    assert ops.count("QLinearMatMul") == 2 and ops.count("MatMulInteger") == 1
    loaded = load(q, backends=["onnxruntime", "reference"])
    assert [p.backend for p in loaded.partitions] == ["onnxruntime"]
    x = _calibration(1, seed=5)["x"][0]
    assert np.array_equal(loaded.run([x])[0], interpret(q.graph, [x])[0])


def test_linear_layers_with_a_bias_run_as_qgemms_wholly_on_ort_and_bit_exactly() -> None:
    """QLinearMatMul has no bias input: a linear layer with one (nn.Linear's default) is one com.microsoft
    QGemm, the int32 bias as its C."""
    q = edgerun.quantize(_mlp(bias=True), "int8-static", calibration=_calibration(8, seed=1), static_linear=True,
                         reduce_range=True)
    ops = [node.op_type for node in build_model(q.graph)[0].graph.node]
    assert ops.count("QGemm") == 2 and ops.count("MatMulInteger") == 1 and "QLinearMatMul" not in ops
    loaded = load(q, backends=["onnxruntime", "reference"])
    assert [p.backend for p in loaded.partitions] == ["onnxruntime"]
    x = _calibration(1, seed=5)["x"][0]
    assert np.array_equal(loaded.run([x])[0], interpret(q.graph, [x])[0])


def test_full_range_int8_weights_do_not_fuse_and_stay_exact() -> None:
    """Weights past +-64 (no reduce_range): ORT's uint8 x int8 AVX2 kernel could saturate, so matmul_integer
    stays on the reference and the requantize alone runs as the epilogue, exactly."""
    q = edgerun.quantize(_mlp(bias=False), "int8-static", calibration=_calibration(8, seed=1), static_linear=True)
    graph = q.graph
    assert not any(ORT.supports(node, graph) for node in graph.nodes if node.op == "matmul_integer")
    loaded = load(q, backends=["onnxruntime", "reference"])
    x = _calibration(1, seed=5)["x"][0]
    assert np.array_equal(loaded.run([x])[0], interpret(q.graph, [x])[0])


def test_a_per_row_multiplier_is_not_fused_and_stays_exact() -> None:
    """QLinearMatMul's b_scale is per tensor or per column: a multiplier per row runs as MatMulInteger + ORT's
    float32 epilogue (Cast, Mul, QuantizeLinear), still bit-exact."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((6, 32), DType.uint8))
    acc = b.emit("matmul_integer", [x, b.const(_q(np.int8, 32, 5, lo=-63, hi=63)), b.const(np.array(121, np.uint8)),
                                    b.const(np.zeros((), np.int8))])
    scale = (RNG.random((6, 1)) * 5e-3 + 1e-3).astype(F)
    g.outputs = [b.emit("requantize", [acc, b.const(scale), b.const(np.array(97, np.uint8))], arithmetic="float32")]
    ops = [node.op_type for node in build_model(g)[0].graph.node]
    assert "QLinearMatMul" not in ops and "QGemm" not in ops and ops.count("MatMulInteger") == 1
    xs = _q(np.uint8, 6, 32)
    assert np.array_equal(ORT.compile(g)(xs)[0], interpret(g, [xs], decompose=False)[0])
