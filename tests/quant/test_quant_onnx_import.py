"""ONNX's quantized ops import into the quantized IR and match ONNX Runtime on random data."""

from __future__ import annotations

import numpy as np
import pytest
from quant_ort_nodes import run_ort, single_node_model

from edgerun.frontends.onnx import import_onnx_graph
from edgerun.oracle import interpret
from edgerun.oracle.quant_kernels import pack_int4


def _both(model, inputs, constant: dict[str, np.ndarray] | None = None):  # type: ignore[no-untyped-def]
    graph = import_onnx_graph(model, constant_inputs=constant)
    ours = interpret(graph, {f"in{i}": a for i, a in enumerate(inputs) if f"in{i}" in graph.inputs})
    return ours, run_ort(model, inputs), graph


def _q(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    return rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, size=shape).astype(dtype)


def test_quantize_and_dequantize_linear_per_axis_import_exactly() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 4, 3, 3)) * 10).astype(np.float32)
    scale, zp = (rng.random(4) + 0.1).astype(np.float32), _q(rng, (4,), np.int8)
    ours, ref, graph = _both(single_node_model("QuantizeLinear", [x, scale, zp], axis=1), [x, scale, zp])
    assert [n.op for n in graph.nodes if n.op != "reshape"] == ["quantize_linear"]
    np.testing.assert_array_equal(ours[0], ref[0])
    q = ref[0]
    ours, ref, _ = _both(single_node_model("DequantizeLinear", [q, scale, zp], axis=1), [q, scale, zp])
    np.testing.assert_array_equal(ours[0], ref[0])


def test_conv_integer_imports_as_an_exact_integer_conv_even_for_large_windows() -> None:
    # The float32 path refused windows of 432 products before; integer accumulation has no such limit.
    rng = np.random.default_rng(1)
    x, w = _q(rng, (1, 48, 6, 6), np.uint8), _q(rng, (8, 48, 3, 3), np.uint8)
    x_zp, w_zp = np.array(128, np.uint8), np.array(3, np.uint8)
    ours, ref, graph = _both(single_node_model("ConvInteger", [x, w, x_zp, w_zp], pads=[1, 1, 1, 1]),
                             [x, w, x_zp, w_zp])
    assert "conv_integer" in graph.op_counts()
    np.testing.assert_array_equal(ours[0], ref[0])


def test_matmul_integer_and_dynamic_quantize_linear_import_exactly() -> None:
    rng = np.random.default_rng(2)
    a, b = _q(rng, (3, 40), np.uint8), _q(rng, (40, 5), np.uint8)
    ours, ref, _ = _both(single_node_model("MatMulInteger", [a, b, None, _q(rng, (5,), np.uint8)]),
                         [a, b, None, _q(np.random.default_rng(2), (5,), np.uint8)])
    x = (rng.standard_normal((4, 9)) * 3).astype(np.float32)
    ours, ref, graph = _both(single_node_model("DynamicQuantizeLinear", [x], n_outputs=3), [x])
    assert graph.op_counts() == {"dynamic_quantize": 1}
    for o, r in zip(ours, ref):
        np.testing.assert_array_equal(o, r)


@pytest.mark.parametrize("per_channel", [False, True])
def test_qlinear_conv_within_one_step_of_onnxruntime(per_channel: bool) -> None:
    rng = np.random.default_rng(3)
    x, w = _q(rng, (1, 8, 7, 7), np.uint8), _q(rng, (6, 8, 3, 3), np.int8) // 2  # 7-bit, see the kernel tests
    xs, xz = np.array(0.05, np.float32), np.array(120, np.uint8)
    ws = (rng.random(6) * 0.02 + 0.01).astype(np.float32) if per_channel else np.array(0.02, np.float32)
    wz = np.zeros(ws.shape, np.int8)
    ys, yz = np.array(0.3, np.float32), np.array(128, np.uint8)
    bias = rng.integers(-500, 500, size=6).astype(np.int32)
    ins = [x, xs, xz, w, ws, wz, ys, yz, bias]
    ours, ref, graph = _both(single_node_model("QLinearConv", ins, pads=[1, 1, 1, 1], strides=[2, 2]), ins)
    assert {"conv_integer", "requantize"} <= set(graph.op_counts())
    diff = np.abs(ours[0].astype(int) - ref[0].astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.9


def test_qlinear_matmul_within_one_step_of_onnxruntime() -> None:
    rng = np.random.default_rng(4)
    a, b = _q(rng, (2, 6, 32), np.uint8), _q(rng, (32, 10), np.uint8)
    ins = [a, np.array(0.04, np.float32), np.array(100, np.uint8), b, np.array(0.03, np.float32),
           np.array(128, np.uint8), np.array(0.2, np.float32), np.array(90, np.uint8)]
    ours, ref, _ = _both(single_node_model("QLinearMatMul", ins), ins)
    diff = np.abs(ours[0].astype(int) - ref[0].astype(int))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.9


def test_matmulnbits_imports_as_int4_matmul() -> None:
    rng = np.random.default_rng(5)
    k, n, group = 96, 16, 32
    q = rng.integers(0, 16, size=(n, 3, group)).astype(np.uint8)
    scales = (rng.random(n * 3) * 0.1).astype(np.float32)
    zp = pack_int4(np.pad(rng.integers(0, 16, size=(n, 3)).astype(np.uint8), ((0, 0), (0, 1)))).reshape(-1)
    a = rng.standard_normal((2, 5, k)).astype(np.float32)
    ins = [a, pack_int4(q), scales, zp, None, rng.standard_normal(n).astype(np.float32)]
    model = single_node_model("MatMulNBits", ins, domain="com.microsoft", K=k, N=n, bits=4, block_size=group,
                              output_shape=[2, 5, n])
    ours, ref, graph = _both(model, ins, {"in3": zp})  # zero points must be static (they are unpacked)
    assert "matmul_int4" in graph.op_counts()
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-5)


def test_unsupported_quantization_is_refused_with_the_reason() -> None:
    from edgerun.errors import UnsupportedOpError
    a = np.zeros((2, 64), np.float32)
    model = single_node_model("MatMulNBits", [a, np.zeros((4, 2, 16), np.uint8), np.ones(8, np.float32)],
                              domain="com.microsoft", K=64, N=4, bits=8, block_size=32, output_shape=[2, 4])
    with pytest.raises(UnsupportedOpError, match="8-bit"):
        import_onnx_graph(model)
