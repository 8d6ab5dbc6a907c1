"""Scaling factors (the seed's Eq. 4-8), canary sampling, fixed point and digit slicing."""

from __future__ import annotations

import numpy as np
import pytest

from edgerun.accel.quant import output_requant, scaling_factor, slice_digits, to_fixed
from edgerun.errors import EdgerunError


def test_seed_scaling_rules():
    n, top = 64, 15.0  # N x N data in [0, n-1]
    assert scaling_factor("conv2D", 0, top, n) == pytest.approx(1 / (top**2 * n))  # Eq. 5
    assert scaling_factor("add", 0, top) == pytest.approx(1 / (2 * top))  # Eq. 6
    assert scaling_factor("mul", 0, top) == pytest.approx(1 / top**2)  # Eq. 7
    assert scaling_factor("tanh", 0, top) == pytest.approx(1 / top)  # Eq. 8
    # the worked example: GEMM then add -> max output 2 N (n-1)^2
    assert 0.5 * scaling_factor("FullyConnected", 0, top, n) == pytest.approx(1 / (2 * n * top**2))


def test_eq4_output_requant_is_exact_when_the_interval_fits():
    assert output_requant(0, 255) == (1.0, -128)
    assert output_requant(-127, 0) == (1.0, -1)
    mult, _ = output_requant(0, 1000)
    assert mult == pytest.approx(255 / 1000)


@pytest.mark.parametrize("nonneg", [True, False])
def test_digits_recombine_exactly(nonneg):
    rng = np.random.default_rng(0)
    vals = rng.integers(0 if nonneg else -(2**15), 2**15, 500)
    fx = to_fixed(vals.astype(float), 16)
    assert fx.frac_bits == 0 and np.array_equal(fx.values, vals)
    for width in (1, 4, 7):
        digits = slice_digits(fx, width)
        assert all(d.values.min() >= d.lo and d.values.max() <= d.hi for d in digits)
        assert np.array_equal(sum(d.values.astype(np.int64) << d.shift for d in digits), vals)


def test_small_integers_use_only_the_bits_they_need():
    assert to_fixed(np.array([0.0, 1.0, 2.0]), 16).bits == 2
    assert to_fixed(np.array([-128.0, 127.0]), 16).bits == 8


def test_canary_miss_rescales_instead_of_saturating():
    x = np.zeros(100_000)
    x[12345] = 1e6  # one extreme value the sample is unlikely to see
    x[:50] = 0.5
    fx = to_fixed(x, 16)
    assert fx.canary_missed
    assert fx.nonneg and fx.values.max() < 2**16  # unsigned 16 bits, no saturation
    assert np.ldexp(float(fx.values[12345]), -fx.frac_bits) == pytest.approx(1e6, rel=1e-4)


def test_fixed_point_rejects_nan_and_bad_precision():
    with pytest.raises(EdgerunError, match="NaN"):
        to_fixed(np.array([1.0, np.nan]), 16)
    with pytest.raises(EdgerunError, match="precision"):
        to_fixed(np.array([1.0]), 40)
