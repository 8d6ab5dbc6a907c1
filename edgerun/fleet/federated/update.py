"""Validation of one device's weight update before it is aggregated.

An update is a delta per trained weight (name -> array) and the number of local samples it was trained on.
The server refuses an update that cannot be the honest result of local training on the global model: the
wrong set of weights or a wrong shape, a value that is not finite (NaN, inf), a global L2 norm past the
job's bound (a poisoned or diverged update: a 100x update is refused, not averaged in), or a sample count
that is not a positive integer. Each refusal names one reason from REFUSAL_REASONS, so rounds count them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

REFUSAL_REASONS = ("wrong_weights", "wrong_shape", "not_finite", "norm_exceeded", "bad_sample_count")


def update_norm(delta: Mapping[str, np.ndarray]) -> float:
    """The global L2 norm of an update over all its weights (float64 accumulation)."""
    return float(np.sqrt(sum(float(np.sum(np.square(np.asarray(a, np.float64)))) for a in delta.values())))


def validate_update(delta: Mapping[str, np.ndarray], samples: object, reference: Mapping[str, np.ndarray],
                    norm_bound: float | None = None) -> str | None:
    """None when the update may be aggregated, else the reason it is refused (one of REFUSAL_REASONS).

    `reference` holds the global weights (only their names, shapes and dtypes are read); `norm_bound` is
    the largest global L2 norm accepted (None: no bound)."""
    if set(delta) != set(reference):
        return "wrong_weights"
    for name, array in delta.items():
        if not isinstance(array, np.ndarray) or array.shape != reference[name].shape or array.dtype.kind != "f":
            return "wrong_shape"
    if not all(bool(np.all(np.isfinite(a))) for a in delta.values()):
        return "not_finite"
    if norm_bound is not None and update_norm(delta) > norm_bound:
        return "norm_exceeded"
    if isinstance(samples, bool) or not isinstance(samples, int | np.integer) or samples <= 0:
        return "bad_sample_count"
    return None
