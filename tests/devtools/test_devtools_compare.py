"""Error metrics and tolerances."""

import math

import numpy as np
import pytest

from edgerun.devtools.compare import Tolerance, Tolerances, compare_arrays, ulp_distance
from edgerun.errors import EdgerunError


def test_ulp_distance_counts_representable_values_across_zero() -> None:
    a = np.array([1.0, -0.0, np.nextafter(np.float32(1), np.float32(2))], np.float32)
    e = np.array([1.0, 0.0, 1.0], np.float32)
    assert ulp_distance(a, e).tolist() == [0, 0, 1]
    lo = np.array([-np.float32(1e-45)], np.float32)  # smallest negative subnormal
    hi = np.array([np.float32(1e-45)], np.float32)
    assert ulp_distance(lo, hi).tolist() == [2]
    h = np.array([1.0], np.float16)
    assert ulp_distance(np.nextafter(h, np.float16(2)), h).tolist() == [1]


def test_metrics_on_a_known_perturbation() -> None:
    e = np.array([3.0, 4.0], np.float32)
    a = np.array([3.0, 4.5], np.float32)
    s = compare_arrays(a, e, Tolerance(1e-5, 1e-4))
    assert not s.passed and s.violations == 1
    assert s.max_abs == pytest.approx(0.5) and s.max_rel == pytest.approx(0.125)
    assert s.mse == pytest.approx(0.125)
    assert s.snr_db == pytest.approx(10 * math.log10(25 / 0.25))
    assert s.cosine == pytest.approx((9 + 18) / (5 * math.hypot(3, 4.5)))
    assert compare_arrays(e, e, Tolerance(0, 0)).passed


def test_nan_where_the_reference_has_none_always_fails() -> None:
    e = np.array([1.0, np.inf, np.nan], np.float32)
    same = compare_arrays(e.copy(), e, Tolerance(1e9, 1e9))
    assert same.passed and same.nan == 1 and same.inf == 1
    bad = compare_arrays(np.array([np.nan, np.inf, np.nan], np.float32), e, Tolerance(1e9, 1e9))
    assert not bad.passed and bad.nonfinite_mismatch == 1 and bad.nan == 2
    flipped = compare_arrays(np.array([1.0, -np.inf, np.nan], np.float32), e, Tolerance(1e9, 1e9))
    assert not flipped.passed


def test_atol_scales_with_the_tensor_magnitude() -> None:
    e = np.array([1000.0, 0.0], np.float32)
    a = np.array([1000.0, 5e-3], np.float32)
    assert compare_arrays(a, e, Tolerance(1e-5, 1e-4)).passed  # 5e-3 <= 1e-5 * 1000
    assert not compare_arrays(a, e, Tolerance(1e-6, 1e-4)).passed


def test_integers_exact_and_shape_mismatch_fails() -> None:
    tol = Tolerances()
    e = np.array([1, 2], np.int64)
    assert compare_arrays(e.copy(), e, tol["int64"]).passed
    assert not compare_arrays(np.array([1, 3], np.int64), e, tol["int64"]).passed
    assert not compare_arrays(np.zeros(3, np.float32), np.zeros(2, np.float32), tol["float32"]).passed


def test_tolerance_overrides_parse() -> None:
    t = Tolerances.parse(["float32=0.1,0.2"])
    assert t["float32"] == Tolerance(0.1, 0.2) and t["float16"] == Tolerances()["float16"]
    with pytest.raises(EdgerunError):
        Tolerances.parse(["float32:0.1"])
