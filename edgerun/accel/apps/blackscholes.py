"""BlackScholes (call prices) with the cumulative normal as a 9th-degree polynomial evaluated by
FullyConnected: the powers t^0..t^9 (t = d / 4, clipped to [-1, 1]) are built with pair-wise `mul` on the
npu and contracted with the coefficients in one FullyConnected. The reference is the same formula in
float64, so the comparison measures the device, not the polynomial. size^2 options."""

from __future__ import annotations

import numpy as np

from edgerun.accel.apps.common import App, Data, uniform
from edgerun.accel.runtime import Runtime

DEGREE = 9
SPAN = 4.0


def _coefficients() -> np.ndarray:
    from math import erf

    t = np.cos(np.pi * (np.arange(200) + 0.5) / 200)  # Chebyshev nodes on [-1, 1]
    phi = np.array([0.5 * (1 + erf(SPAN * v / np.sqrt(2))) for v in t])
    return np.polynomial.polynomial.polyfit(t, phi, DEGREE)  # t^0 .. t^9


COEF = _coefficients()


def make(n: int, rng: np.random.Generator, value_range: tuple[float, float] | None) -> Data:
    count = n * n
    s = np.abs(uniform(rng, count, value_range)) + 1.0 if value_range else uniform(rng, count, (10.0, 100.0))
    return {"s": s, "k": s * rng.uniform(0.9, 1.1, count), "r": rng.uniform(0.01, 0.05, count),
            "v": rng.uniform(0.2, 0.5, count), "t": rng.uniform(0.25, 2.0, count)}


def _d12(d: Data) -> tuple[np.ndarray, np.ndarray]:
    sq = d["v"] * np.sqrt(d["t"])
    d1 = (np.log(d["s"] / d["k"]) + (d["r"] + 0.5 * d["v"] ** 2) * d["t"]) / sq
    return d1, d1 - sq


def _price(d: Data, n1: np.ndarray, n2: np.ndarray) -> np.ndarray:
    return d["s"] * n1 - d["k"] * np.exp(-d["r"] * d["t"]) * n2


def reference(d: Data) -> np.ndarray:
    d1, d2 = _d12(d)
    cnd = [np.polynomial.polynomial.polyval(np.clip(x / SPAN, -1, 1), COEF) for x in (d1, d2)]
    return _price(d, *cnd)


def on_npu(rt: Runtime, d: Data) -> np.ndarray:
    d1, d2 = _d12(d)
    t = np.clip(np.concatenate([d1, d2]) / SPAN, -1, 1)
    powers = [np.ones_like(t), t]
    for _ in range(DEGREE - 1):
        powers.append(rt.run("mul", powers[-1], t))
    cnd = rt.run("FullyConnected", np.stack(powers, axis=1), COEF[:, None])[:, 0]
    return _price(d, cnd[: len(d1)], cnd[len(d1):])


APP = App("blackscholes", make, reference, on_npu, "call prices, CNDF as a degree-9 polynomial by FullyConnected")
