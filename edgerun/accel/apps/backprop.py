"""Backprop (Rodinia's bpnn, one training step): FullyConnected layers forward, the weight deltas as
tpuGemm outer products, the update as a pair-wise `add`. Sigmoid and the small delta vectors run on the host.
Layers: size inputs (+ bias unit) -> size hidden (+ bias) -> 1 output."""

from __future__ import annotations

import numpy as np

from edgerun.accel.apps.common import App, Data, uniform
from edgerun.accel.runtime import Runtime

ETA = 0.3
TARGET = 0.1


def make(n: int, rng: np.random.Generator, value_range: tuple[float, float] | None) -> Data:
    x = uniform(rng, n, value_range or (0.0, 1.0))
    scale = 1.0 / np.sqrt(n)
    return {"x": np.concatenate([[1.0], x]),
            "w1": uniform(rng, (n + 1, n), (-scale, scale)),
            "w2": uniform(rng, (n + 1, 1), (-scale, scale))}


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -500, 500)))


def _step(d: Data, fc, outer, add) -> np.ndarray:  # type: ignore[no-untyped-def]
    x, w1, w2 = d["x"], d["w1"], d["w2"]
    h = np.concatenate([[1.0], _sigmoid(fc(x, w1))])
    o = _sigmoid(fc(h, w2))
    delta_o = o * (1 - o) * (TARGET - o)
    delta_h = h[1:] * (1 - h[1:]) * (w2[1:, 0] * delta_o[0])
    w2_new = add(w2, outer(h[:, None], ETA * delta_o[None, :]))
    w1_new = add(w1, outer(x[:, None], ETA * delta_h[None, :]))
    return np.concatenate([o, w1_new.ravel(), w2_new.ravel()])


def reference(d: Data) -> np.ndarray:
    return _step(d, lambda v, w: v @ w, lambda a, b: a @ b, lambda a, b: a + b)


def on_npu(rt: Runtime, d: Data) -> np.ndarray:
    return _step(d, lambda v, w: rt.run("FullyConnected", v, w), rt.gemm, lambda a, b: rt.run("add", a, b))


APP = App("backprop", make, reference, on_npu, "one bpnn training step: FC forward, tpuGemm deltas, add update")
