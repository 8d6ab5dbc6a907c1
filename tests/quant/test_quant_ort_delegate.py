"""The ONNX Runtime delegate runs the quantized ops on ORT's integer kernels, exactly where it claims them."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

import edgerun
from edgerun.backends.onnxruntime import OnnxRuntimeBackend
from edgerun.backends.onnxruntime.onnx_quant_ops import QUANT_SUPPORTED, X86_FMA
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.oracle.quant_kernels import pack_int4

ORT = OnnxRuntimeBackend(threads=1)
RNG = np.random.default_rng(0)


def _q(dtype: type, *shape: int, lo: int | None = None, hi: int | None = None) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1, shape).astype(dtype)


def _graph(op: str, inputs: list[np.ndarray], constant: list[bool], **attrs: Any) -> tuple[Graph, list[np.ndarray]]:
    g = Graph()
    names, feed = [], []
    for k, (v, c) in enumerate(zip(inputs, constant)):
        if c:
            names.append(g.add_constant(v))
        else:
            names.append(g.add_input(f"in{k}", TensorSpec(v.shape, DType.of(v))))
            feed.append(v)
    g.outputs = Builder(g).emit_multi(op, names, **attrs)
    return g, feed


F = np.float32
CASES = [
    ("quantize_linear-per-channel", "quantize_linear",
     [RNG.standard_normal((2, 4, 3, 3)).astype(F) * 9, (RNG.random((4, 1, 1)) + 0.1).astype(F), _q(np.int8, 4, 1, 1)],
     [False, True, True], {}),
    ("dequantize_linear-int32-per-channel", "dequantize_linear",
     [_q(np.int32, 1, 4, 2, 2, lo=-10 ** 6, hi=10 ** 6), (RNG.random((4, 1, 1)) * 1e-3).astype(F), np.zeros((), np.int32)],
     [False, True, True], {}),
    ("dynamic_quantize", "dynamic_quantize", [RNG.standard_normal((3, 40)).astype(F)], [False], {"dtype": "uint8"}),
    ("matmul_integer-u8s8-7bit", "matmul_integer",
     [_q(np.uint8, 2, 6, 64), _q(np.int8, 64, 5, lo=-63, hi=63), np.array(131, np.uint8), np.zeros((), np.int8)],
     [False, True, True, True], {}),
    ("conv_integer-u8s8-7bit", "conv_integer",
     [_q(np.uint8, 1, 8, 9, 9), _q(np.int8, 6, 8, 3, 3, lo=-63, hi=63), np.array(7, np.uint8), np.zeros((), np.int8)],
     [False, True, True, True], {"padding": [1, 1, 1, 1], "stride": [2, 2]}),
    ("matmul_int4", "matmul_int4",
     [RNG.standard_normal((3, 64)).astype(F), pack_int4(_q(np.uint8, 8, 2, 32, lo=0, hi=15)),
      (RNG.random((8, 2)) * 0.1).astype(F), _q(np.uint8, 8, 2, lo=0, hi=15)],
     [False, True, True, True], {"k": 64, "n": 8, "group_size": 32}),
    ("requantize-float32-per-channel", "requantize",
     [_q(np.int32, 1, 4, 3, 3, lo=-2 ** 30, hi=2 ** 30), (RNG.random((4, 1, 1)) * 1e-6).astype(F), np.array(9, np.uint8)],
     [False, True, True], {"arithmetic": "float32"}),
    ("quantized_add-uint8", "quantized_add",
     [_q(np.uint8, 1, 8, 9, 9), np.array(0.031, F), np.array(117, np.uint8), _q(np.uint8, 1, 8, 9, 9),
      np.array(0.047, F), np.array(3, np.uint8), np.array(0.052, F), np.array(0, np.uint8)],
     [False, True, True, False, True, True, True, True], {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_claimed_quant_op_matches_the_exact_reference(case: tuple[str, str, list[np.ndarray], list[bool], dict[str, Any]]) -> None:
    _, op, inputs, constant, attrs = case
    if op == "quantized_add" and not X86_FMA:
        pytest.skip("QLinearAdd computes quantized_add's arithmetic on x86 with AVX2 and FMA only")
    graph, feed = _graph(op, inputs, constant, **attrs)
    assert ORT.supports(graph.nodes[0], graph), f"the delegate should claim {op} here"
    got, want = ORT.compile(graph)(*feed), interpret(graph, feed, decompose=False)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        if w.dtype.kind == "f" and op == "matmul_int4":
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, w)


def test_every_claimed_quant_op_has_a_case() -> None:
    assert set(QUANT_SUPPORTED) == {c[1] for c in CASES}


def test_full_range_u8s8_and_exact_requantize_stay_on_the_reference() -> None:
    graph, _ = _graph("matmul_integer", [_q(np.uint8, 2, 64), _q(np.int8, 64, 3), np.array(0, np.uint8),
                                          np.zeros((), np.int8)], [False, True, True, True])
    assert not ORT.supports(graph.nodes[0], graph)  # weights past +-64: ORT's AVX2 pair sums could saturate
    graph, _ = _graph("requantize", [_q(np.int32, 4, 4), np.array(0.01, F), np.array(3, np.uint8)], [False, True, True])
    assert not ORT.supports(graph.nodes[0], graph)  # exact arithmetic: ORT's float32 epilogue can be a step off


def _qlinear_conv_graph(cin: int, cout: int, groups: int, stride: int, pad: int, bias: bool) -> tuple[Graph, np.ndarray]:
    """uint8 x -> conv_integer (7-bit weights) [+ int32 bias] -> requantize(float32): one QLinearConv."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((1, cin, 11, 11), DType.uint8))
    w = b.const(_q(np.int8, cout, cin // groups, 3, 3, lo=-63, hi=63))
    acc = b.emit("conv_integer", [x, w, b.const(np.array(117, np.uint8)), b.const(np.zeros((), np.int8))],
                 stride=[stride, stride], padding=[pad] * 4, groups=groups)
    if bias:
        acc = b.emit("add", [acc, b.const(_q(np.int32, cout, 1, 1, lo=-5000, hi=5000))])
    scale = (RNG.random((cout, 1, 1)) * 2e-4 + 1e-5).astype(F)
    g.outputs = [b.emit("requantize", [acc, b.const(scale), b.const(np.array(100, np.uint8))], arithmetic="float32")]
    return g, _q(np.uint8, 1, cin, 11, 11)


@pytest.mark.parametrize("cin,cout,groups,stride,pad,bias", [
    (8, 6, 1, 1, 1, True), (8, 16, 1, 2, 0, False), (16, 16, 16, 1, 1, True), (12, 12, 12, 2, 1, False),
    (8, 4, 2, 1, 1, True)], ids=["3x3-bias", "stride2-nobias", "depthwise", "depthwise-stride2", "grouped"])
def test_conv_requantize_chain_runs_as_one_bit_exact_qlinearconv(cin: int, cout: int, groups: int, stride: int,
                                                                 pad: int, bias: bool) -> None:
    from edgerun.backends.onnxruntime import build_model
    graph, x = _qlinear_conv_graph(cin, cout, groups, stride, pad, bias)
    assert all(ORT.supports(n, graph) for n in graph.nodes)
    model, _ = build_model(graph)
    assert [n.op_type for n in model.graph.node if n.op_type not in ("Reshape",)] == ["QLinearConv"]
    got, want = ORT.compile(graph)(x)[0], interpret(graph, [x], decompose=False)[0]
    assert got.dtype == np.uint8 and len(np.unique(want)) > 0 and np.array_equal(got, want)


def test_int8_program_with_reduced_range_runs_its_integer_layers_on_ort() -> None:
    from test_quant_flows import images, small_cnn
    program = small_cnn()
    q = edgerun.quantize(program, "int8-static", calibration={"image": images(2, seed=1)}, reduce_range=True)
    claimed = [n.op for n in q.graph.nodes if n.op in ("conv_integer", "matmul_integer", "requantize")
               and ORT.supports(n, q.graph)]
    assert sorted(claimed) == ["conv_integer"] * 2 + ["matmul_integer"] * 2 + ["requantize"] * 2
    from edgerun.backends.onnxruntime import build_model
    assert [n.op_type for n in build_model(q.graph)[0].graph.node].count("QLinearConv") == 2
    x = images(1, seed=5)[0]
    got = edgerun.load(q, backends=[ORT])(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    np.testing.assert_allclose(got, interpret(q.graph, [x])[0], rtol=1e-4, atol=1e-5)


def test_zoo_mobilenet_int8_static_runs_wholly_on_ort_and_bit_exactly() -> None:
    """Depthwise and pointwise QLinearConvs, folded ReLU6, float residual adds, the MatMulInteger classifier:
    the whole int8 program on ONNX Runtime equals the reference interpreter bit for bit."""
    from edgerun.runtime.loader import load
    from edgerun.zoo import get
    from edgerun.zoo.inputs import natural_image

    program = edgerun.export(get("mobilenet_v2").build(), (natural_image(32, seed=0),))
    calibration = {program.graph.inputs[0]: natural_image(32, seed=1, batch=2).numpy()[:, None]}
    q = edgerun.quantize(program, "int8-static", calibration=calibration, reduce_range=True)
    loaded = load(q, backends=["onnxruntime", "reference"])
    assert [p.backend for p in loaded.partitions] == ["onnxruntime"]
    x = natural_image(32, seed=7).numpy()
    got, want = loaded.run([x])[0], interpret(q.graph, [x])[0]
    assert np.array_equal(got, want)
