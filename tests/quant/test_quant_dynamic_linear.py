"""int8-dynamic linear layers on ONNX Runtime: the delegate spells each as its own quantize_dynamic models do
(DynamicQuantizeLinear, MatMulInteger, Cast, Mul by the product of the scales, the bias Add), so ORT's optimizer
fuses them into DynamicQuantizeMatMul / MatMulIntegerToFloat, its fast path; bit-exact with the reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("onnxruntime")

import onnxruntime as ort

import edgerun
from edgerun.backends.onnxruntime import build_model
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.program import Program
from edgerun.runtime.loader import load
from tests.quant.test_quant_static_linear import _calibration, _mlp


def _ort_optimized_ops(graph: Graph, folder: Path) -> list[str]:
    """The op types ONNX Runtime runs for `graph` after its own graph optimizations (as the delegate's session)."""
    model, external = build_model(graph)
    for tensor in model.graph.initializer:  # the delegate hands these over as OrtValues; inline them here
        if tensor.name in external:
            tensor.ClearField("external_data")
            tensor.data_location = onnx.TensorProto.DEFAULT
            tensor.raw_data = np.ascontiguousarray(external[tensor.name]).tobytes()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.add_session_config_entry("session.disable_quant_qdq", "1")  # as the delegate's sessions
    options.optimized_model_filepath = str(folder / "optimized.onnx")
    ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [node.op_type for node in onnx.load(str(folder / "optimized.onnx")).graph.node]


@pytest.mark.parametrize("bias", [False, True])
def test_int8_dynamic_linear_layers_run_as_ort_fused_dynamic_quantize_matmuls_bit_exactly(bias: bool,
                                                                                          tmp_path: Path) -> None:
    q = edgerun.quantize(_mlp(bias=bias), "int8-dynamic", reduce_range=True)
    ops = _ort_optimized_ops(q.graph, tmp_path)
    assert ops.count("DynamicQuantizeMatMul") == 3, ops  # each with its bias folded in
    assert not {"MatMulInteger", "DynamicQuantizeLinear", "DequantizeLinear", "Add"} & set(ops), ops
    loaded = load(q, backends=["onnxruntime", "reference"])
    assert [p.backend for p in loaded.partitions] == ["onnxruntime"]
    for seed in range(4):
        x = _calibration(1, seed=20 + seed)["x"][0] * (1 + 3 * seed)
        assert np.array_equal(loaded.run([x])[0], interpret(q.graph, [x])[0])


def test_a_scale_computed_from_two_activations_keeps_dequantize_linear(tmp_path: Path) -> None:
    """Only a constant weight scale takes the fused form; the accumulator of a product of two activations
    (per-call scales on both sides) stays MatMulInteger + DequantizeLinear."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((4, 8), DType.float32))
    y = g.add_input("y", TensorSpec((8, 4), DType.float32))
    xq, xs, xz = b.emit_multi("dynamic_quantize", [x], dtype="uint8")
    yq, ys, yz = b.emit_multi("dynamic_quantize", [y], dtype="uint8")
    acc = b.emit("matmul_integer", [xq, yq, xz, yz])
    g.outputs = [b.emit("dequantize_linear", [acc, b.emit("mul", [xs, ys]), b.const(np.zeros((), np.int32))])]
    ops = [node.op_type for node in build_model(Program(graph=g).graph)[0].graph.node]
    assert ops.count("MatMulInteger") == 1 and ops.count("DequantizeLinear") == 1 and "Cast" not in ops
