"""Helpers shared by the zoo tests (imported as a plain module: tests/ has no packages)."""

from __future__ import annotations

import numpy as np

TINY = 1e-30


def relative_error(got: np.ndarray, want: np.ndarray) -> float:
    """max|got - want| / max(max|want|, tiny): the error relative to the output's own scale."""
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got64 - want64)) / max(float(np.max(np.abs(want64))), TINY))


def cosine_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """1 - cos(a_i, b_i) for each row."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    dots = np.sum(a64 * b64, axis=-1)
    return 1 - dots / (np.linalg.norm(a64, axis=-1) * np.linalg.norm(b64, axis=-1))
