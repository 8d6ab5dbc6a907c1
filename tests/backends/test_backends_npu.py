"""The `npu` backend: an int8-static program's integer products placed on the emulated device through the
partitioner, bit-identical to the reference; float programs untouched; what it does not claim falls back."""

from __future__ import annotations

import numpy as np
import pytest
from small_cnn import small_cnn as _small_cnn

import edgerun
from edgerun.backends.npu import NpuBackend, create_backend
from edgerun.backends.registry import get_backend
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle.quant_kernels import QUANT_KERNELS
from edgerun.program import Program
from edgerun.runtime import load


def small_cnn(seed: int = 0) -> Program:
    """The shared small CNN on [2, 3, 12, 12] with a 32-wide hidden layer."""
    return _small_cnn((2, 3, 12, 12), hidden=32, seed=seed)


def images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, 2, 3, 12, 12)).astype(np.float32)


def on_backend(loaded: object, backend: str) -> list[str]:
    return [n.op for p in loaded.partitions if p.backend == backend for n in p.nodes]  # type: ignore[attr-defined]


@pytest.mark.parametrize("scheme", ["int8-static", "int8-dynamic"])
def test_int8_cnn_places_its_integer_products_on_npu_bit_exactly(scheme: str) -> None:
    calibration = {"image": images(3, seed=1)} if scheme == "int8-static" else None
    q = edgerun.quantize(small_cnn(), scheme=scheme, calibration=calibration)
    npu = NpuBackend()
    loaded = load(q.graph, [npu, "reference"])
    placed = on_backend(loaded, "npu")
    assert sorted(placed) == ["conv_integer", "conv_integer", "matmul_integer", "matmul_integer"], placed
    assert not {"quantize_linear", "dynamic_quantize", "requantize", "dequantize_linear"} & set(placed)
    want = load(q.graph, ["reference"])
    assert on_backend(want, "npu") == []
    for i in range(2):
        x = images(1, seed=10 + i)[0]
        for got, ref in zip(loaded.run([x]), want.run([x])):
            assert got.dtype == ref.dtype and np.array_equal(got, ref)
    stats = npu.device_stats()
    assert stats["instructions"] > 0 and stats["device_model_s"] > 0  # the work really went to the device


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.int8, np.int8), (np.uint8, np.int8), (np.uint8, np.uint8)])
def test_matmul_integer_equals_the_oracle_kernel_at_the_extremes(a_dtype: type, b_dtype: type) -> None:
    """Full-range operands and zero points at the opposite ends: |shifted| reaches 255, sums reach K*255^2."""
    rng = np.random.default_rng(3)
    lo_a, hi_a = np.iinfo(a_dtype).min, np.iinfo(a_dtype).max
    lo_b, hi_b = np.iinfo(b_dtype).min, np.iinfo(b_dtype).max
    a: np.ndarray = rng.integers(lo_a, hi_a + 1, (2, 5, 300)).astype(a_dtype)
    a[0, 0] = lo_a
    b: np.ndarray = rng.integers(lo_b, hi_b + 1, (300, 130)).astype(b_dtype)
    b[:, 0] = hi_b
    a_zp: np.ndarray = np.array(hi_a, a_dtype)
    b_zp: np.ndarray = np.array(lo_b, b_dtype)
    g = Graph()
    bld = Builder(g)
    va = g.add_input("a", TensorSpec(a.shape, DType(np.dtype(a_dtype).name)))
    vb = g.add_input("b", TensorSpec(b.shape, DType(np.dtype(b_dtype).name)))
    g.outputs = [bld.emit("matmul_integer", [va, vb, bld.const(a_zp), bld.const(b_zp)])]
    loaded = load(g, [NpuBackend(), "reference"])
    assert on_backend(loaded, "npu") == ["matmul_integer"]
    want = np.empty((2, 5, 130), np.int32)
    QUANT_KERNELS["matmul_integer"]([a, b, a_zp, b_zp], {}, [want])
    got = loaded.run([a, b])[0]
    assert got.dtype == np.int32 and np.array_equal(got, want)
    assert int(np.abs(want).max()) > 255 * 255 * 100  # the sums are far outside 8 bits


def test_grouped_strided_dilated_conv_integer_equals_the_oracle_kernel() -> None:
    rng = np.random.default_rng(4)
    x = rng.integers(0, 256, (1, 4, 9, 10)).astype(np.uint8)
    w = rng.integers(-128, 128, (6, 2, 3, 2)).astype(np.int8)
    x_zp, w_zp = np.array(3, np.uint8), np.array([[[[-2]]], [[[0]]], [[[5]]], [[[127]]], [[[-128]]], [[[1]]]], np.int8)
    attrs = {"stride": [2, 1], "padding": [1, 0, 2, 1], "dilation": [1, 2], "groups": 2}
    g = Graph()
    bld = Builder(g)
    vx = g.add_input("x", TensorSpec(x.shape, DType.uint8))
    g.outputs = [bld.emit("conv_integer", [vx, bld.const(w), bld.const(x_zp), bld.const(w_zp)], **attrs)]
    loaded = load(g, [NpuBackend(), "reference"])
    assert on_backend(loaded, "npu") == ["conv_integer"]
    out_spec = loaded.graph.specs[loaded.graph.outputs[0]]
    want = np.empty(out_spec.shape, np.int32)
    QUANT_KERNELS["conv_integer"]([x, w, x_zp, w_zp], attrs, [want])
    assert np.array_equal(loaded.run([x])[0], want)


def test_a_float_program_places_nothing_on_npu_and_still_runs() -> None:
    program = small_cnn()
    x = images(1, seed=5)[0]
    loaded = load(program.graph, ["npu", "reference"])
    assert on_backend(loaded, "npu") == []
    np.testing.assert_array_equal(loaded.run([x])[0], load(program.graph, ["reference"]).run([x])[0])


def test_a_product_too_long_for_the_int32_accumulator_stays_on_the_reference() -> None:
    """K * 255^2 >= 2^31 could wrap the int32 accumulator: not claimed, the reference runs it."""
    k = 2**31 // (255 * 255) + 1
    g = Graph()
    bld = Builder(g)
    va = g.add_input("a", TensorSpec((1, k), DType.int8))
    vb = g.add_input("b", TensorSpec((k, 2), DType.int8))
    zero = bld.const(np.array(0, np.int8))
    g.outputs = [bld.emit("matmul_integer", [va, vb, zero, zero])]
    npu = NpuBackend()
    assert not npu.supports(g.nodes[0], g)
    loaded = load(g, [npu, "reference"])
    assert on_backend(loaded, "npu") == [] and on_backend(loaded, "reference") == ["matmul_integer"]
    a, b = np.ones((1, k), np.int8), np.full((k, 2), 2, np.int8)
    assert loaded.run([a, b])[0].tolist() == [[2 * k, 2 * k]]


def test_registry_and_declared_throughput_come_from_the_device_model() -> None:
    backend = get_backend("npu")
    assert isinstance(backend, NpuBackend) and backend.name == "npu"
    t = create_backend().throughput
    assert t.transfer_bytes_per_s == pytest.approx((1 << 20) / 6e-3)  # ~6 ms per MB, the seed's figure
    assert 1e8 < t.flops_per_s < 1e10 and t.dispatch_s == pytest.approx(1 / 10268.80)
