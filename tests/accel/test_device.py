"""The emulated npu: exact integer kernels, requantization, memory, and the cost model."""

from __future__ import annotations

import numpy as np
import pytest

from edgerun.accel import costmodel
from edgerun.accel.device import Instruction, NpuDevice, exact_int_matmul, requantize
from edgerun.accel.tensorizer import conv2d_gemm_layout
from edgerun.errors import EdgerunError


def test_strided_conv2d_layout_is_exactly_the_matrix_product():
    rng = np.random.default_rng(1)
    a = rng.integers(-128, 128, (3, 20, 37)).astype(np.int8)  # 3 "digits" of a 20 x 37 matrix
    b = rng.integers(-128, 128, (2, 37, 9)).astype(np.int8)
    img, filt, s = conv2d_gemm_layout(a, b)
    assert s == 7  # ceil(sqrt(37))
    dev = NpuDevice()
    acc_ins = Instruction("conv2D", (("a", img), ("b", filt)), {"stride": (s, s)}, multiplier=1 / 4096)
    from edgerun.accel.device import compute_accumulator

    acc, _ = compute_accumulator(acc_ins)
    want = np.einsum("imk,jkn->imjn", a.astype(np.int64), b.astype(np.int64))
    assert np.array_equal(np.asarray(acc, dtype=np.int64).reshape(3, 20, 2, 9), want)
    assert dev.execute(acc_ins).dtype == np.int8


@pytest.mark.parametrize("bound", [2**20, 2**40, 2**60])
def test_blas_integer_matmul_matches_int64(bound):
    rng = np.random.default_rng(2)
    a = rng.integers(-128, 128, (33, 70))
    b = rng.integers(-128, 128, (70, 5))
    got = exact_int_matmul(a, b, bound)
    assert np.array_equal(np.asarray(got, dtype=np.int64), a @ b)


def test_requantize_counts_saturation_and_exact_instructions_refuse_it():
    q, sat = requantize(np.array([0, 100, 300, -400]), 1.0, 0)
    assert list(q) == [0, 100, 127, -128] and sat == 2
    ins = Instruction("add", (("x", np.full((2, 2), 100, np.int8)), ("y", np.full((2, 2), 100, np.int8))), exact=True)
    with pytest.raises(EdgerunError, match="saturated"):
        NpuDevice().execute(ins)


def test_memory_limit_residency_and_unknown_operator():
    dev = NpuDevice(memory_bytes=1000)
    x = np.ones((10, 10), np.int8)
    dev.execute(Instruction("ReLU", (("x", x),)))
    dev.execute(Instruction("ReLU", (("x", x),)))  # resident: not copied again
    assert dev.bytes_in == 100 and dev.instructions == 2 and dev.resident("x")
    dev.free("x")
    assert not dev.resident("x") and dev.used_bytes == 0
    dev.copy_in("y", x)  # explicit copy-in: the next instruction on "y" moves nothing
    dev.execute(Instruction("ReLU", (("y", x),)))
    assert dev.bytes_in == 200 and dev.bytes_out == 300
    with pytest.raises(EdgerunError, match="cannot be held"):
        dev.execute(Instruction("ReLU", (("big", np.ones((40, 40), np.int8)),)))
    with pytest.raises(EdgerunError, match="unknown npu operator 'softmax'"):
        dev.execute(Instruction("softmax", (("x", x),)))
    with pytest.raises(EdgerunError, match="int8"):
        dev.execute(Instruction("ReLU", (("f", np.ones((2, 2))),)))


def test_cost_model_follows_table1():
    conv = costmodel.instruction_seconds("conv2D", 128 * 128)
    fc = costmodel.instruction_seconds("FullyConnected", 128)
    assert conv == pytest.approx(1 / 10268.80, rel=1e-3)
    assert fc == pytest.approx(1 / 51924.96, rel=1e-3)
    # results per second: conv2D makes 25x the results of FullyConnected
    assert (128 * 128 / conv) / (128 / fc) == pytest.approx(25.3, rel=0.01)
    assert costmodel.transfer_seconds(1 << 20) == pytest.approx(0.006)
    assert costmodel.instruction_seconds("mean", 4) == pytest.approx(4 / 408.54)
