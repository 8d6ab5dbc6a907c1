"""GEMM: C = A @ B through tpuGemm (strided conv2D)."""

from __future__ import annotations

import numpy as np

from edgerun.accel.apps.common import App, Data, uniform
from edgerun.accel.runtime import Runtime


def make(n: int, rng: np.random.Generator, value_range: tuple[float, float] | None) -> Data:
    r = value_range or (0.0, 1.0)  # default dataset: uniform floats in [0, 1)
    return {"a": uniform(rng, (n, n), r), "b": uniform(rng, (n, n), r)}


def reference(d: Data) -> np.ndarray:
    return d["a"] @ d["b"]


def on_npu(rt: Runtime, d: Data) -> np.ndarray:
    return rt.gemm(d["a"], d["b"])


APP = App("gemm", make, reference, on_npu, "A @ B with tpuGemm (conv2D at stride ceil(sqrt(K)))")
