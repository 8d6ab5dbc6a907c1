"""tpuGemm: exact on small integers, accurate on wide floats, conv2D cheaper than FullyConnected, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from edgerun.accel import SCALE, Runtime, gemm
from edgerun.errors import EdgerunError


@pytest.mark.parametrize("method", ["conv2D", "FullyConnected"])
@pytest.mark.parametrize("lo,hi", [(0, 3), (-128, 128), (-(2**15), 2**15)])
def test_exact_on_small_integers(method, lo, hi):
    rng = np.random.default_rng(3)
    a = rng.integers(lo, hi, (130, 70))  # more than one 128-row tile
    b = rng.integers(lo, hi, (70, 20))
    assert np.array_equal(gemm(a, b, method=method), (a @ b).astype(np.float64))


def test_two_devices_and_long_k_blocks_stay_exact():
    rng = np.random.default_rng(4)
    a = rng.integers(-4, 4, (40, 600)).astype(float)  # K = 600: three K-blocks of bit planes
    b = rng.integers(-4, 4, (600, 50)).astype(float)
    assert np.array_equal(gemm(a, b, devices=2), a @ b)


def test_wide_float_data_within_target():
    rng = np.random.default_rng(5)
    a = rng.uniform(-(2.0**31), 2.0**31, (48, 48))
    b = rng.uniform(-(2.0**31), 2.0**31, (48, 48))
    got, ref = gemm(a, b), a @ b
    assert np.mean(np.abs(got - ref) / np.abs(ref)) < 0.01
    assert np.max(np.abs(got - ref)) / np.abs(ref).max() < 1e-3


def test_device_model_shows_why_conv2d_wins():
    rng = np.random.default_rng(6)
    a, b = rng.integers(0, 4, (128, 128)), rng.integers(0, 4, (128, 128))
    times = {}
    for method in ("conv2D", "FullyConnected"):
        with Runtime(1) as rt:
            rt.gemm(a, b, method=method)
            times[method] = rt.devices[0].compute_s
    assert times["FullyConnected"] / times["conv2D"] > 20


def test_scale_method_is_the_lossy_one_pass():
    rng = np.random.default_rng(7)
    a, b = rng.uniform(0, 1, (32, 32)), rng.uniform(0, 1, (32, 32))
    with Runtime(1) as rt:
        got = rt.gemm(a, b, flags=SCALE)
    rel = np.abs(got - a @ b) / np.abs(a @ b)
    assert 0 < np.mean(rel) < 0.2


@pytest.mark.parametrize("a,b,msg", [
    (np.full((2, 2), np.nan), np.ones((2, 2)), "NaN or infinite"),
    (np.ones((2, 2)), np.full((2, 2), np.inf), "NaN or infinite"),
    (np.ones((2, 3)), np.ones((2, 3)), r"\(M, K\) @ \(K, N\)"),
    (np.full((4, 4), 1e200), np.full((4, 4), 1e200), "overflow"),
    (np.array([["a"]]), np.ones((1, 1)), "numeric"),
])
def test_bad_input_is_a_clear_error(a, b, msg):
    with pytest.raises(EdgerunError, match=msg):
        gemm(a, b)


def test_shape_the_device_cannot_hold():
    with Runtime(1, memory_bytes=2048) as rt, pytest.raises(EdgerunError, match="device memory"):
        rt.gemm(np.ones((64, 64)), np.ones((64, 64)))


def test_bad_devices_count():
    with pytest.raises(EdgerunError, match="devices"):
        gemm(np.ones((2, 2)), np.ones((2, 2)), devices=0)


def test_empty_products_match_numpy():
    assert gemm(np.ones((0, 3)), np.ones((3, 2))).shape == (0, 2)
    assert np.array_equal(gemm(np.ones((2, 0)), np.ones((0, 3))), np.zeros((2, 3)))
