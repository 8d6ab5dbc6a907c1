"""The tiny GGUF's step on `webgpu` against the reference, each layer's `cache_attention` one kernel.

The LLM package's cache is in GroupQueryAttention's layout ("heads"), the browser plan's in "keys_transposed";
both run fused (the caches appended in place by the attention kernel) and unfused (one dispatch per op: the
caches copied to the updated values' ranges, then the kernel appends there).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("wgpu")

import edgerun.llm
from edgerun.errors import BackendUnavailableError
from edgerun.llm.checkpoint import load_checkpoint
from edgerun.llm.model import model_info
from edgerun.llm.program_builder import CacheLayout, cache_specs, step_graph
from edgerun.llm.step_runner import StepRunner
from edgerun.program import Program
from edgerun.runtime import load

from .test_tiny_gguf import write_tiny_gguf

try:
    from edgerun.backends.webgpu import WebGpuBackend, get_device

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
    # each layer's attention one dispatch, its caches appended in place: q and k|v, attention, o, gate|up, down
    assert kernels.count("cache_attention:workgroup") == 2 and "cache_attention:copy" not in kernels, kernels
    assert len(kernels) == 1 + 2 * 5 + 3, kernels
    for steps in ([IDS], [[7], [9], [11]]):
        for ids in steps:
            want, got = cpu.runner.forward(ids), gpu.runner.forward(ids)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize(("layout", "fuse"), [("heads", False), ("keys_transposed", True),
                                             ("keys_transposed", False)])
def test_step_on_webgpu_gives_the_reference_logits_in_both_cache_layouts(tmp_path: Path, layout: CacheLayout,
                                                                         fuse: bool) -> None:
    # Prefill (a chunk, then a short one padded) and decode steps reading the cache the earlier steps wrote.
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    checkpoint = load_checkpoint(path)
    info = model_info(checkpoint, 16, 4)
    weights = {n: checkpoint.float_weight(n) for n in checkpoint.weights}
    weights.update({f"{n}.T": np.ascontiguousarray(w.T) for n, w in weights.items() if w.ndim == 2})
    methods = {name: step_graph(info.config, weights, chunk=chunk, context=16, layout=layout)
               for name, chunk in (("prefill", 4), ("decode", 1))}
    state = {n: np.zeros(s.shape, np.float32) for n, s in cache_specs(info.config, 16, layout).items()}
    program = Program.from_methods(methods, default_method="prefill", state=state)
    gpu, cpu = (StepRunner(load(program, backends=b), chunk=4, context=16)
                for b in ([WebGpuBackend(fuse=fuse)], ["reference"]))
    kernels = [k.label for k in gpu.decode.parts.compiled[0].info["runner"].kernels]
    assert {p.backend for p in gpu.decode.partitions} == {"webgpu"}
    assert kernels.count("cache_attention:workgroup") == 2
    assert kernels.count("cache_attention:copy") == (0 if fuse else 2)  # unfused: no in-place update
    for ids in ([3, 17, 99, 5, 64, 1], [7], [9], [11, 12]):
        want, got = cpu.forward(ids), gpu.forward(ids)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, float(np.abs(want).max())))
