"""Gaussian elimination (Rodinia's, no pivoting) solving A x = b: each row reduction's products are one
pair-wise `mul` on the npu (multipliers broadcast against the pivot row); the host subtracts and
back-substitutes."""

from __future__ import annotations

import numpy as np

from edgerun.accel.apps.common import App, Data, uniform
from edgerun.accel.runtime import Runtime


def make(n: int, rng: np.random.Generator, value_range: tuple[float, float] | None) -> Data:
    r = value_range or (0.0, 1.0)
    a = uniform(rng, (n, n), r)
    a[np.diag_indices(n)] += n * max(abs(r[0]), abs(r[1]))  # diagonally dominant: no pivoting needed
    return {"a": a, "b": uniform(rng, n, r)}


def _back_substitute(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    n = len(b)
    x = np.zeros(n)
    for i in range(n - 1, -1, -1):
        x[i] = (b[i] - a[i, i + 1:] @ x[i + 1:]) / a[i, i]
    return x


def reference(d: Data) -> np.ndarray:
    a, b = d["a"].copy(), d["b"].copy()
    for t in range(len(b) - 1):
        m = a[t + 1:, t] / a[t, t]
        a[t + 1:, t:] -= m[:, None] * a[t, t:]
        b[t + 1:] -= m * b[t]
    return _back_substitute(a, b)


def on_npu(rt: Runtime, d: Data) -> np.ndarray:
    a, b = d["a"].copy(), d["b"].copy()
    for t in range(len(b) - 1):
        m = a[t + 1:, t] / a[t, t]
        rows = len(m)
        prod = rt.run("mul", np.repeat(m[:, None], len(b) - t, axis=1), np.repeat(a[t:t + 1, t:], rows, axis=0))
        a[t + 1:, t:] -= prod
        b[t + 1:] -= m * b[t]
    return _back_substitute(a, b)


APP = App("gaussian", make, reference, on_npu, "forward elimination with pair-wise mul per pivot")
