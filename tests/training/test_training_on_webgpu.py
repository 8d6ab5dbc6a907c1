"""A training program on the WebGPU backend (lavapipe in CI): every method's partitions compile (the backward
graph's max pool transpose fills with -inf, which WGSL spells through e_bits) and the gradients and steps
equal the reference's."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import edgerun.training as T
from edgerun.errors import BackendUnavailableError
from edgerun.zoo.digits_cnn import DigitsCNN

try:
    from edgerun.backends.webgpu import get_device

    get_device()
except BackendUnavailableError as exc:  # pragma: no cover - CI installs lavapipe
    pytest.skip(f"no WebGPU adapter: {exc}", allow_module_level=True)


def test_the_digits_cnn_trains_on_webgpu_without_falling_back() -> None:
    torch.manual_seed(0)
    module = DigitsCNN(8, 16, 32).eval()
    x, y = torch.rand(4, 1, 8, 8), torch.randint(0, 10, (4,))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a partition falling back to the reference warns
        gpu = T.from_torch(module, (x,), optimizer=T.SGD(0.05), backends=["webgpu"])
    ref = T.from_torch(module, (x,), optimizer=T.SGD(0.05), backends=["reference"])
    for method in ("train_step", "gradients"):
        assert {p.backend for p in gpu.loaded.method(method).partitions} == {"webgpu"}, method
    ours, want = gpu.gradients(x.numpy(), y.numpy()), ref.gradients(x.numpy(), y.numpy())
    for name in want:
        np.testing.assert_allclose(ours[name], want[name], rtol=1e-4, atol=1e-6 * np.abs(want[name]).max())
    for _ in range(3):
        np.testing.assert_allclose(gpu.train_step(x.numpy(), y.numpy()), ref.train_step(x.numpy(), y.numpy()),
                                   rtol=1e-5)
