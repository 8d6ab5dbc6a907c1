"""The tiny GGUF's step on `webgpu` against the reference, cache in GroupQueryAttention's layout.

In that layout the step reads its keys as a transpose of the cache's reshaped view; the WebGPU lowering
computed such a transpose inside its one reader's kernel, and the fused attention kernel, which loads its
operands from memory, then read a buffer nothing had written (SmolLM2 answered "<" tokens for "Paris").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("wgpu")

import edgerun.llm
from edgerun.errors import BackendUnavailableError

from .test_tiny_gguf import write_tiny_gguf

try:
    from edgerun.backends.webgpu import get_device

    get_device()
except BackendUnavailableError as exc:  # pragma: no cover - CI installs lavapipe
    pytest.skip(f"no WebGPU adapter: {exc}", allow_module_level=True)

IDS = [3, 17, 99, 5, 64, 1, 2, 120]


def test_each_step_on_webgpu_gives_the_reference_logits(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    gpu, cpu = (edgerun.llm.load(path, dequantize=True, context=16, chunk=8, backends=b)
                for b in (["webgpu"], ["reference"]))
    for program in (gpu.runner.prefill, gpu.runner.decode):
        assert {p.backend for p in program.partitions} == {"webgpu"}
    kernels = [k.label for k in gpu.runner.decode.parts.compiled[0].info["runner"].kernels]
    assert any(label.startswith("attention") for label in kernels), kernels  # the fused attention kernel is in use
    for steps in ([IDS], [[7], [9], [11]]):
        for ids in steps:
            want, got = cpu.runner.forward(ids), gpu.runner.forward(ids)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
