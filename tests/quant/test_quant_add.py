"""quantized_add: ONNX Runtime's QLinearAdd arithmetic as a reference kernel, bit for bit, and int8-static's
residual adds and max pools staying uint8 between layers (ONNX Runtime's own quantized ResNet form)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from onnx import helper

import edgerun
from edgerun.backends.onnxruntime.onnx_quant_ops import X86_FMA
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.oracle.quant_add_kernel import fma32, quantized_add_values
from edgerun.program import Program
from tests.quant.quant_ort_nodes import run_ort, single_node_model

needs_x86_fma = pytest.mark.skipif(not X86_FMA, reason="ONNX Runtime's QLinearAdd is this arithmetic on x86 AVX2+FMA only")


def _float32_nearest(exact: Fraction) -> np.float32:
    """The float32 nearest to `exact`, ties to the even mantissa, by comparing exact distances."""
    guess = np.float32(float(exact))
    candidates = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    best = min(abs(Fraction(float(c)) - exact) for c in candidates)
    near = [c for c in candidates if abs(Fraction(float(c)) - exact) == best]
    return near[0] if len(near) == 1 else next(c for c in near if (c.view(np.int32) & 1) == 0)


def test_fma32_rounds_once_where_float64_cannot_hold_the_sum() -> None:
    """x * y + z for float32 operands, rounded once: against exact rational arithmetic, on random operands
    and on sums that float64 cannot hold exactly (z far below x * y) and that sit on float32 midpoints."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(4000) * 10.0 ** rng.integers(-3, 4, 4000)).astype(np.float32)
    y = (rng.standard_normal(4000) * 10.0 ** rng.integers(-3, 4, 4000)).astype(np.float32)
    z = (rng.standard_normal(4000) * 10.0 ** rng.integers(-12, 4, 4000)).astype(np.float32)
    # midpoints: x * y exactly half a float32 step past a float32, nudged by a z too small for float64's sum
    one = np.float32(1 + 2 ** -23)
    x[:100], y[:100] = one, one  # (1 + 2^-23)^2 = 1 + 2^-22 + 2^-46: a float32 plus 2^-46
    z[:50] = np.float32(2 ** -80)
    z[50:100] = np.float32(-(2 ** -80))
    got = fma32(x, y, z)
    want = np.array([_float32_nearest(Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c)))
                     for a, b, c in zip(x, y, z)], np.float32)
    assert np.array_equal(got.view(np.int32), want.view(np.int32))


@needs_x86_fma
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_quantized_add_is_bit_exact_with_onnxruntime_qlinearadd(dtype: type) -> None:
    """Random codes, scales over six octaves and every kind of zero point, and scale ratios that are powers of
    two (exact ties, rounded half to even): every element equals ONNX Runtime's QLinearAdd."""
    rng = np.random.default_rng(2)
    info = np.iinfo(dtype)
    mismatches, total = 0, 0
    for trial in range(120):
        n = int(rng.integers(1, 700))  # tails of MLAS's 32-element loop included
        a = rng.integers(info.min, info.max + 1, n).astype(dtype)
        b = rng.integers(info.min, info.max + 1, n).astype(dtype)
        if trial % 4 == 0:
            scales = [np.float32(2.0 ** -rng.integers(2, 8)) for _ in range(3)]
        else:
            scales = [np.float32(np.exp(rng.uniform(-6, 0))) for _ in range(3)]
        zps = [np.array(rng.integers(info.min, info.max + 1), dtype) for _ in range(3)]
        if trial % 3 == 0:
            zps[2] = np.array(0 if dtype is np.uint8 else info.min, dtype)  # a folded ReLU's range
        args = [a, np.array(scales[0]), zps[0], b, np.array(scales[1]), zps[1], np.array(scales[2]), zps[2]]
        model = single_node_model("QLinearAdd", args, domain="com.microsoft")
        model.graph.output[0].type.CopyFrom(helper.make_tensor_type_proto(
            helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), [n]))  # a contrib op's output is not inferred
        want = run_ort(model, args)[0]
        got = quantized_add_values(*args)
        assert got.dtype == want.dtype
        mismatches += int(np.count_nonzero(got != want))
        total += n
    assert mismatches == 0, f"{mismatches} of {total} elements differ"


def test_quantized_add_refuses_mismatched_operands() -> None:
    g = Graph()
    b = Builder(g)
    a = g.add_input("a", TensorSpec((4,), DType.uint8))
    c = g.add_input("c", TensorSpec((5,), DType.uint8))
    s, z = b.const(np.array(0.1, np.float32)), b.const(np.array(0, np.uint8))
    with pytest.raises(ValueError, match="one shape"):
        b.emit("quantized_add", [a, s, z, c, s, z, s, z])
    with pytest.raises(ValueError, match="zero point"):
        b.emit("quantized_add", [a, s, z, a, s, b.const(np.array(0, np.int8)), s, z])


def _residual_net() -> Program:
    """conv -> relu -> max pool -> [conv -> relu -> conv] + identity -> relu -> conv -> output: a ResNet block."""
    rng = np.random.default_rng(0)
    g = Graph()
    b = Builder(g)
    x = g.add_input("image", TensorSpec((1, 3, 16, 16), DType.float32))

    def conv(v: str, cin: int, cout: int) -> str:
        w = b.const((rng.standard_normal((cout, cin, 3, 3)) / (3 * cin) ** 0.5).astype(np.float32))
        return b.emit("conv2d", [v, w, b.const(rng.standard_normal(cout).astype(np.float32) * 0.1)],
                      padding=[1, 1, 1, 1])
    stem = b.emit("max_pool2d", [b.emit("relu", [conv(x, 3, 8)])], kernel=[3, 3], stride=[2, 2],
                  padding=[1, 1, 1, 1])
    branch = conv(b.emit("relu", [conv(stem, 8, 8)]), 8, 8)
    block = b.emit("relu", [b.emit("add", [branch, stem])])
    g.outputs = [conv(block, 8, 4)]
    return Program(graph=g)


def test_int8_static_keeps_residual_adds_uint8_and_max_pools_in_their_input_range() -> None:
    """The residual add becomes one quantized_add of the two uint8 values with its ReLU folded; the max pool
    stays float between the stem's dequantize and a quantize with the stem's own scale and zero point (so
    the quantize gives back the max of the codes, and every backend runs it)."""
    program = _residual_net()
    rng = np.random.default_rng(3)
    calibration = {"image": rng.standard_normal((8, 1, 3, 16, 16)).astype(np.float32)}
    q = edgerun.quantize(program, "int8-static", calibration=calibration, reduce_range=True)
    counts = q.graph.op_counts()
    assert counts["quantized_add"] == 1 and counts["quantize_linear"] == 2  # the image's and the pool's
    assert "relu" not in counts  # folded into the requantizations
    float_adds = [n for n in q.graph.nodes if n.op == "add" and q.graph.specs[n.outputs[0]].dtype is DType.float32]
    assert [n.outputs[0] for n in float_adds] == q.graph.outputs  # the last conv's float bias; the rest int32
    producers = q.graph.producers()
    pool = next(n for n in q.graph.nodes if n.op == "max_pool2d")
    dq = producers[pool.inputs[0]]
    requant = next(n for n in q.graph.nodes if n.op == "quantize_linear" and n.inputs[0] == pool.outputs[0])
    assert dq.op == "dequantize_linear" and producers[dq.inputs[0]].op == "requantize"
    assert [q.graph.constants[v].item() for v in dq.inputs[1:]] == [q.graph.constants[v].item() for v in requant.inputs[1:]]
    qadd = next(n for n in q.graph.nodes if n.op == "quantized_add")
    assert requant.outputs[0] in qadd.inputs  # the identity path reads the pooled codes
    assert int(q.graph.constants[qadd.inputs[7]]) == 0  # the folded ReLU's range starts at 0
    xs = calibration["image"][0]
    ref, got = interpret(program.graph, [xs])[0], interpret(q.graph, [xs])[0]
    assert 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got) ** 2)) > 25


@needs_x86_fma
def test_residual_int8_program_runs_wholly_on_onnxruntime_and_bit_exactly() -> None:
    """The delegate emits QLinearConv, QLinearAdd and a MaxPool of the uint8 codes (no float between the
    stem and the last conv): one ORT partition, equal to the reference interpreter bit for bit."""
    from edgerun.backends.onnxruntime import build_model
    from edgerun.runtime.loader import load

    program = _residual_net()
    rng = np.random.default_rng(4)
    calibration = {"image": rng.standard_normal((8, 1, 3, 16, 16)).astype(np.float32)}
    q = edgerun.quantize(program, "int8-static", calibration=calibration, reduce_range=True)
    loaded = load(q, backends=["onnxruntime", "reference"])
    assert [p.backend for p in loaded.partitions] == ["onnxruntime"]
    model = build_model(loaded.partitions[0].subgraph(loaded.graph))[0]
    ops = sorted(node.op_type for node in model.graph.node)
    assert ops.count("QLinearConv") == 3 and ops.count("QLinearAdd") == 1 and ops.count("QuantizeLinear") == 1, ops
    pool = next(node for node in model.graph.node if node.op_type == "MaxPool")
    made_by = {out: node.op_type for node in model.graph.node for out in node.output}
    assert made_by[pool.input[0]] == "QLinearConv"  # it pools the stem's uint8 codes
    for seed in range(3):
        x = np.random.default_rng(10 + seed).standard_normal((1, 3, 16, 16)).astype(np.float32) * (1 + seed)
        assert np.array_equal(loaded.run([x])[0], interpret(q.graph, [x])[0])
