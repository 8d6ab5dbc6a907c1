"""Error metrics between an actual and an expected tensor, and the per-dtype tolerances that judge them.

A tensor passes when every element satisfies |actual - expected| <= atol * scale + rtol * |expected|,
where `scale` is max(1, max|expected|): atol is relative to the tensor's own magnitude, so a matmul whose
outputs reach 1e3 is not failed for rounding noise of 1e-4 in an element that happens to cancel to zero.
Non-finite values must match exactly (NaN where the reference has NaN, inf of the same sign); a NaN the
reference does not have always fails, whatever the tolerance. Integers and bools compare exactly by default.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from edgerun.errors import EdgerunError


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


# fp32: a few ulps of the largest magnitude plus 1e-4 relative; tight enough that an fp16 accumulator or a
# one-off index shows, loose enough for a different summation order. fp16 is about 2^-11 per rounding.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(atol=1e-5, rtol=1e-4),
    "float16": Tolerance(atol=2e-3, rtol=2e-3),
    # fp64: the same allowance for a different summation order, at double's 2^-53 per rounding.
    "float64": Tolerance(atol=1e-12, rtol=1e-11),
    **{d: Tolerance(0.0, 0.0) for d in ("int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
                                        "bool")},
}


class Tolerances:
    """Per-dtype tolerances: the defaults above, with overrides (`float32=1e-4,1e-3`: atol,rtol)."""

    def __init__(self, overrides: Mapping[str, Tolerance] | None = None) -> None:
        self.by_dtype = dict(DEFAULT_TOLERANCES)
        self.by_dtype.update(overrides or {})

    def __getitem__(self, dtype: str) -> Tolerance:
        return self.by_dtype.get(dtype, Tolerance(0.0, 0.0))

    @staticmethod
    def parse(specs: Sequence[str] | None) -> Tolerances:
        overrides: dict[str, Tolerance] = {}
        for spec in specs or ():
            try:
                dtype, values = spec.split("=", 1)
                atol, rtol = (float(v) for v in values.split(","))
            except ValueError:
                raise EdgerunError(f"tolerance {spec!r} must look like float32=ATOL,RTOL") from None
            overrides[dtype.strip()] = Tolerance(atol, rtol)
        return Tolerances(overrides)

    def to_json(self) -> dict[str, dict[str, float]]:
        return {k: asdict(v) for k, v in self.by_dtype.items()}


@dataclass(frozen=True)
class ErrorStats:
    """How far `actual` is from `expected`. Finite-element metrics ignore positions non-finite in either."""

    dtype: str
    numel: int
    max_abs: float
    max_rel: float  # max |a-e| / max(|e|, eps * scale) over finite elements (scale as in the tolerance)
    mse: float
    snr_db: float  # 10 log10(sum e^2 / sum (a-e)^2); inf when identical
    cosine: float  # of the flattened tensors; 1 for two all-zero tensors
    max_ulp: int  # float32/float16 only: largest distance in units in the last place; 0 for other dtypes
    nan: int  # NaN count in actual
    inf: int  # inf count in actual
    nonfinite_mismatch: int  # positions where actual and expected disagree on being NaN/inf
    violations: int  # elements outside the tolerance (non-finite mismatches included)
    shape_ok: bool = True

    @property
    def passed(self) -> bool:
        return self.shape_ok and self.violations == 0

    def to_json(self) -> dict[str, object]:
        d = asdict(self)
        d["passed"] = self.passed
        return {k: (_json_float(v) if isinstance(v, float) else v) for k, v in d.items()}


def _json_float(v: float) -> float | str:
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf") if not math.isnan(v) else "nan"


def ulp_distance(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Elementwise distance in representable values between two float32 or float16 arrays (as int64)."""
    itype, lowest = {np.dtype(np.float32): (np.int32, -(2**31)), np.dtype(np.float16): (np.int16, -(2**15))}[
        actual.dtype]

    def ordered(x: np.ndarray) -> np.ndarray:
        # Reinterpret the bits so that integer order is float order: negative floats count down from zero.
        i = np.ascontiguousarray(x).view(itype).astype(np.int64)
        return np.where(i < 0, lowest - i, i)
    return np.abs(ordered(actual) - ordered(expected))


def compare_arrays(actual: np.ndarray, expected: np.ndarray, tol: Tolerance) -> ErrorStats:
    dtype = str(expected.dtype)
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return ErrorStats(dtype, int(expected.size), math.inf, math.inf, math.inf, -math.inf, 0.0, 0, 0, 0,
                          int(expected.size), int(expected.size), shape_ok=False)
    if expected.dtype.kind == "f" and actual.tobytes() == expected.tobytes():
        return _identical(dtype, expected)
    if expected.dtype.kind not in "fc":
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        diff = np.abs(a - e)
        bad = int(np.count_nonzero(diff > tol.atol + tol.rtol * np.abs(e)))
        return _stats(dtype, a, e, diff, np.ones(a.shape, bool), bad, 0, 0, 0, 0, 1.0)
    with np.errstate(all="ignore"):
        a, e = actual.astype(np.float64), expected.astype(np.float64)
        fin_a, fin_e = np.isfinite(a), np.isfinite(e)
        both = fin_a & fin_e
        same_nonfinite = (~fin_a & ~fin_e) & ((np.isnan(a) & np.isnan(e)) | (a == e))
        mismatch = int(np.count_nonzero(~both & ~same_nonfinite))
        diff = np.where(both, np.abs(a - e), 0.0)
        scale = max(1.0, float(np.max(np.abs(e[fin_e])))) if fin_e.any() else 1.0
        bad = int(np.count_nonzero(both & (diff > tol.atol * scale + tol.rtol * np.abs(e)))) + mismatch
        ulp = int(np.max(np.where(both, ulp_distance(actual, expected), 0), initial=0)) \
            if expected.dtype in (np.float32, np.float16) else 0
    floor = float(np.finfo(expected.dtype).eps) * scale
    return _stats(dtype, a, e, diff, both, bad, int(np.count_nonzero(np.isnan(a))),
                  int(np.count_nonzero(np.isinf(a))), mismatch, ulp, floor)


def _identical(dtype: str, a: np.ndarray) -> ErrorStats:
    """Bit-identical tensors (the common case for a correct backend): no float64 pass needed."""
    nan, inf = int(np.count_nonzero(np.isnan(a))), int(np.count_nonzero(np.isinf(a)))
    return ErrorStats(dtype, int(a.size), 0.0, 0.0, 0.0, math.inf, 1.0, 0, nan, inf, 0, 0)


def _stats(dtype: str, a: np.ndarray, e: np.ndarray, diff: np.ndarray, valid: np.ndarray, bad: int,
           nan: int, inf: int, mismatch: int, ulp: int, rel_floor: float) -> ErrorStats:
    n = int(np.count_nonzero(valid))
    with np.errstate(all="ignore"):
        max_abs = float(diff.max(initial=0.0))
        rel = diff / np.maximum(np.abs(e), rel_floor)
        max_rel = float(np.max(np.where(valid, rel, 0.0), initial=0.0))
        mse = float(np.sum(diff**2) / n) if n else 0.0
        av, ev = np.where(valid, a, 0.0).ravel(), np.where(valid, e, 0.0).ravel()
        noise = float(np.sum(diff**2))
        signal = float(np.sum(ev**2))
        snr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal > 0 else -math.inf)
        na, ne = float(np.linalg.norm(av)), float(np.linalg.norm(ev))
        cosine = 1.0 if na == 0 and ne == 0 else (float(av @ ev) / (na * ne) if na and ne else 0.0)
    return ErrorStats(dtype, int(a.size), max_abs, max_rel, mse, snr, cosine, ulp, nan, inf, mismatch, bad)


def worst(stats: Sequence[ErrorStats]) -> ErrorStats | None:
    """The stats with the most violations, then the largest absolute error (None for an empty list)."""
    if not stats:
        return None
    return max(stats, key=lambda s: (not s.passed, s.violations, s.max_abs if math.isfinite(s.max_abs) else 1e308))
