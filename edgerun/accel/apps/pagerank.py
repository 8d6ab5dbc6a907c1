"""PageRank by the power method: one FullyConnected per iteration (the column-stochastic matrix is the model)."""

from __future__ import annotations

import numpy as np

from edgerun.accel.apps.common import App, Data, uniform
from edgerun.accel.runtime import Runtime

DAMPING = 0.85
ITERATIONS = 20


def make(n: int, rng: np.random.Generator, value_range: tuple[float, float] | None) -> Data:
    edges = rng.random((n, n)) < min(1.0, 8.0 / n)  # about 8 out-links per page
    np.fill_diagonal(edges, False)
    edges[rng.integers(0, n, n), np.arange(n)] = True  # no dangling page
    # default: unweighted links; a range gives link weights |w| (PageRank needs non-negative weights)
    weights = np.abs(uniform(rng, (n, n), value_range)) + 1.0 if value_range else np.ones((n, n))
    adj = np.where(edges, weights, 0.0)
    return {"m": adj / adj.sum(axis=0, keepdims=True)}


def reference(d: Data) -> np.ndarray:
    m = d["m"]
    n = m.shape[0]
    r = np.full(n, 1.0 / n)
    for _ in range(ITERATIONS):
        r = DAMPING * (m @ r) + (1 - DAMPING) / n
    return r


def on_npu(rt: Runtime, d: Data) -> np.ndarray:
    m = d["m"]
    n = m.shape[0]
    model = np.ascontiguousarray(m.T)  # FullyConnected: vector @ weights
    r = np.full(n, 1.0 / n)
    for _ in range(ITERATIONS):
        r = DAMPING * rt.run("FullyConnected", r, model) + (1 - DAMPING) / n
    return r


APP = App("pagerank", make, reference, on_npu, f"{ITERATIONS} power-method iterations, FullyConnected each")
