"""Observers: what calibration learns about an activation's range, turned into uint8 quantization parameters."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

_SAMPLES_PER_BATCH = 1 << 15  # values a percentile observer keeps from each calibration batch


@dataclass
class MinMaxObserver:
    """The whole range seen: every calibration value is representable, outliers stretch the step."""

    lo: float = np.inf
    hi: float = -np.inf

    def observe(self, x: np.ndarray) -> None:
        if x.size:
            self.lo = min(self.lo, float(x.min()))
            self.hi = max(self.hi, float(x.max()))

    def range(self) -> tuple[float, float]:
        return self.lo, self.hi


@dataclass
class PercentileObserver:
    """The range between two percentiles of a sample of the values: clips rare outliers for a finer step."""

    percentile: float = 99.99
    samples: list[np.ndarray] = field(default_factory=list)
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))

    def observe(self, x: np.ndarray) -> None:
        flat = x.reshape(-1)
        if flat.size > _SAMPLES_PER_BATCH:
            flat = flat[self.rng.integers(0, flat.size, _SAMPLES_PER_BATCH)]
        self.samples.append(flat.astype(np.float32))

    def range(self) -> tuple[float, float]:
        if not self.samples:
            return np.inf, -np.inf
        values = np.concatenate(self.samples)
        lo, hi = np.percentile(values, [100.0 - self.percentile, self.percentile])
        return float(lo), float(hi)


@dataclass
class MseObserver(PercentileObserver):
    """The clipping range, among shrinkings of the min/max range, whose uint8 round trip has the least
    squared error on the sampled values: trades clipping error against step size per tensor."""

    def range(self) -> tuple[float, float]:
        if not self.samples:
            return np.inf, -np.inf
        values = np.concatenate(self.samples).astype(np.float64)
        lo0, hi0 = min(float(values.min()), 0.0), max(float(values.max()), 0.0)
        best, best_err = (lo0, hi0), np.inf
        for shrink in np.linspace(1.0, 0.3, 36):
            lo, hi = lo0 * shrink, hi0 * shrink
            if hi <= lo:
                continue
            scale = (hi - lo) / 255.0
            zp = np.clip(np.rint(-lo / scale), 0, 255)
            back = (np.clip(np.rint(values / scale) + zp, 0, 255) - zp) * scale
            err = float(np.mean((back - values) ** 2))
            if err < best_err:
                best, best_err = (lo, hi), err
        return best


Observer = MinMaxObserver | PercentileObserver | MseObserver
OBSERVERS = {"minmax": MinMaxObserver, "percentile": PercentileObserver, "mse": MseObserver}


def uint8_params(lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Asymmetric uint8 (scale, zero point) for [lo, hi] widened to include 0, so 0 (padding, ReLU) is exact."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if not np.isfinite(lo) or not np.isfinite(hi):
        raise ValueError("the observer saw no finite values")
    scale = np.float32((hi - lo) / 255.0) if hi > lo else np.float32(1.0)
    zp = np.uint8(np.clip(np.rint(-lo / float(scale)), 0, 255))
    return np.asarray(scale, np.float32), np.asarray(zp, np.uint8)
