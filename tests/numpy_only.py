"""The numpy-only test tier (`make test-fast`, `pytest --numpy-only`): the heavy frameworks are refused.

With `--numpy-only` (tests/conftest.py), importing one of the frameworks below skips the test module (at
collection) or the test (at run time) that asked for it, so the tier holds exactly the tests that need numpy
and edgerun alone and cannot import torch by accident: the refusal comes before the framework's first file is
read. The full suite (`make test`) runs without the option and imports everything.
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import pytest

# The frameworks a numpy-only install lacks (each takes seconds to import; torch over ten on this machine).
REFUSED = ("torch", "torchvision", "transformers", "onnx", "onnxruntime", "MNN", "wgpu", "selenium")


class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> None:
        top = fullname.partition(".")[0]
        if top in REFUSED:
            # pytest turns this exception into a skip, of the module during collection and of the test later;
            # it is not an ImportError, so code that falls back on a missing package does not swallow it.
            raise pytest.skip.Exception(f"needs {top}: not in the numpy-only tier", allow_module_level=True)
        return None


def install() -> None:
    """Refuse the frameworks from now on in this process (pytest_configure runs it in every xdist worker)."""
    loaded = sorted(m for m in REFUSED if m in sys.modules)
    if loaded:
        raise pytest.UsageError(f"numpy-only tier: {', '.join(loaded)} imported before the tests started")
    sys.meta_path.insert(0, _Refuse())


class lazy:
    """A module imported on first attribute access: a test module that uses torch only as an oracle in some
    tests keeps its other tests in the numpy-only tier (`torch = lazy("torch")` at the top)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("_") or attr.startswith("pytest"):
            # pytest's collector probes every module global (`__test__`, `pytestmark`, fixture markers):
            # answering those must not import the module.
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)
