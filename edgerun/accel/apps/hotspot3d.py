"""HotSpot3D: the thermal stencil as a 3x3 conv2D per iteration.

Input channels are the layer below, the layer itself, the layer above and the power map; the kernel holds
Rodinia's coefficients (centre, four neighbours, top/bottom, step/capacitance). All layers go in one
conv2D: each layer is edge-padded on the host and stacked, and the rows that straddle two layers are dropped.
"""

from __future__ import annotations

import numpy as np

from edgerun.accel.apps.common import App, Data, uniform
from edgerun.accel.runtime import Runtime

LAYERS = 4
ITERATIONS = 5
CE = CW = CN = CS = 0.1
CT = CB = 0.05
CC = 1.0 - (CE + CW + CN + CS + CT + CB)
SDC = 0.02  # step / capacitance: the power term
AMB = 80.0


def kernel() -> np.ndarray:
    k = np.zeros((3, 3, 4))
    k[1, 1, 0] = CB
    k[:, :, 1] = [[0, CN, 0], [CW, CC, CE], [0, CS, 0]]
    k[1, 1, 2] = CT
    k[1, 1, 3] = SDC
    return k


def make(n: int, rng: np.random.Generator, value_range: tuple[float, float] | None) -> Data:
    t_range = value_range or (320.0, 340.0)  # default: temperatures in kelvin, power in watts
    p_range = value_range or (0.0, 0.5)
    return {"t": uniform(rng, (LAYERS, n, n), t_range), "p": uniform(rng, (LAYERS, n, n), p_range)}


def _channels(t: np.ndarray, p: np.ndarray) -> np.ndarray:
    below = np.concatenate([t[:1], t[:-1]])
    above = np.concatenate([t[1:], t[-1:]])
    return np.stack([below, t, above, p], axis=-1)  # (L, n, n, 4)


def reference(d: Data) -> np.ndarray:
    t, p = d["t"].copy(), d["p"]
    for _ in range(ITERATIONS):
        below = np.concatenate([t[:1], t[:-1]])
        above = np.concatenate([t[1:], t[-1:]])
        tp = np.pad(t, ((0, 0), (1, 1), (1, 1)), mode="edge")
        t = (CC * t + CN * tp[:, :-2, 1:-1] + CS * tp[:, 2:, 1:-1] + CW * tp[:, 1:-1, :-2] + CE * tp[:, 1:-1, 2:]
             + CB * below + CT * above + SDC * p + CT * AMB)
    return t


def on_npu(rt: Runtime, d: Data) -> np.ndarray:
    t, p = d["t"].copy(), d["p"]
    layers, n = t.shape[0], t.shape[1]
    k = kernel()
    for _ in range(ITERATIONS):
        # the temperature's common level leaves the data first (the T taps sum to 1), so the 16 bits
        # describe the variation, not the ~300 K offset
        level = float(t.mean())
        ch = np.pad(_channels(t - level, p), ((0, 0), (1, 1), (1, 1), (0, 0)), mode="edge")  # (L, n+2, n+2, 4)
        image = ch.reshape(layers * (n + 2), n + 2, 4)
        out = rt.stencil(image, k)  # (L*(n+2) - 2, n)
        t = np.stack([out[z * (n + 2): z * (n + 2) + n] for z in range(layers)]) + level + CT * AMB
    return t


APP = App("hotspot3d", make, reference, on_npu, f"{LAYERS} layers, {ITERATIONS} iterations, 3x3x4 conv2D")
