"""int8-static's activation observers: min/max keeps every calibration value, percentile and mse clip outliers
for a finer step, and the flow uses the one asked for."""

from __future__ import annotations

import numpy as np
import pytest
from small_cnn import small_cnn

import edgerun
from edgerun.quantization.observers import OBSERVERS, uint8_params


def _roundtrip_mse(values: np.ndarray, lo: float, hi: float) -> float:
    scale, zp = uint8_params(lo, hi)
    q = np.clip(np.rint(values / scale) + zp, 0, 255)
    return float(np.mean(((q - zp) * scale - values) ** 2))


def _heavy_tailed(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    batches = [rng.standard_normal(50_000).astype(np.float32) for _ in range(3)]
    batches[1][7] = 400.0  # one outlier in 150 000 values
    return batches


def _range(observer: str, batches: list[np.ndarray]) -> tuple[float, float]:
    obs = OBSERVERS[observer]()
    for b in batches:
        obs.observe(b)
    return obs.range()


def test_minmax_keeps_the_outlier_and_percentile_clips_it() -> None:
    batches = _heavy_tailed()
    assert _range("minmax", batches)[1] == 400.0
    lo, hi = _range("percentile", batches)
    assert 3.0 < hi < 6.0 and -6.0 < lo < -3.0  # the 99.99th percentile of a unit normal is 3.7


def test_mse_trades_clipping_for_step_size() -> None:
    """On heavy tails (Student's t, 2 degrees of freedom; every value observed) mse narrows the min/max range
    and its uint8 round trip loses less than min/max's."""
    rng = np.random.default_rng(0)
    batches = [rng.standard_t(2, 20_000).astype(np.float32) for _ in range(3)]
    values = np.concatenate(batches)
    (lo, hi), (mse_lo, mse_hi) = _range("minmax", batches), _range("mse", batches)
    assert lo < mse_lo < 0 < mse_hi < hi
    assert _roundtrip_mse(values, mse_lo, mse_hi) < 0.95 * _roundtrip_mse(values, lo, hi)


@pytest.mark.parametrize("observer", ["percentile", "mse"])
def test_int8_static_uses_the_observer_asked_for(observer: str) -> None:
    """Heavy-tailed calibration images (Student's t): the graph input's scale is the observer's range over them,
    narrower than min/max's."""
    program = small_cnn()
    rng = np.random.default_rng(1)
    images = rng.standard_t(2, (16, *program.graph.specs["image"].shape)).astype(np.float32)

    def input_scale(q: edgerun.Program) -> float:
        node = next(n for n in q.graph.nodes if n.op == "quantize_linear" and n.inputs[0] == "image")
        return float(q.graph.constants[node.inputs[1]])
    minmax = input_scale(edgerun.quantize(program, "int8-static", calibration={"image": images}))
    clipped = edgerun.quantize(program, "int8-static", calibration={"image": images}, observer=observer)
    assert clipped.metadata["quantization"]["observer"] == observer
    assert input_scale(clipped) == float(uint8_params(*_range(observer, list(images)))[0]) < minmax
