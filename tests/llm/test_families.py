"""Every family of families.py against transformers: a small random model of each, written offline by
`AutoModelForCausalLM.from_config(...).save_pretrained(...)`, loaded as a Hugging Face folder, gives
transformers' logits (within LOGIT_TOLERANCE) and greedy tokens.

Each config turns on what its family adds, with numbers small enough to matter in a 13-token prompt run
in prefill chunks of 8 (so a sliding window of 4 crosses chunks and reads the cache): Llama 3.1's RoPE
scaling (an original context of 16 puts frequencies in all three bands), Mistral's sliding window, Qwen2's
q/k/v biases, Qwen3's QK-norm with a head size other than dim/heads, Phi-3's partial rotary, Gemma 2's
alternating windows, soft-capped scores and logits and query_pre_attn_scalar, Gemma 3's QK-norm, window
pattern and two rotary bases. Norm weights and biases are random, so a wrong import of them shows.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgerun.llm
from edgerun.errors import EdgerunError

LOGIT_TOLERANCE = 2e-4  # absolute, on logits of magnitude ~1 (float32 against float32, other summation orders)
IDS = [5, 17, 300, 42, 7, 99, 250, 3, 1, 64, 128, 11, 400]
COMMON = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2,
              pad_token_id=0)
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", dict(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "mistral": ("MistralConfig", dict(sliding_window=4)),
    "qwen2": ("Qwen2Config", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(head_dim=24)),
    "phi3": ("Phi3Config", dict(partial_rotary_factor=0.5)),
    "gemma2": ("Gemma2Config", dict(head_dim=16, sliding_window=4, query_pre_attn_scalar=24,
                                    attn_logit_softcapping=5.0, final_logit_softcapping=3.0)),
    "gemma3": ("Gemma3TextConfig", dict(head_dim=16, sliding_window=4, sliding_window_pattern=2,
                                        query_pre_attn_scalar=16)),
}


def write_family_model(folder: Path, family: str, seed: int = 0) -> Any:
    import torch
    import transformers

    cls, extra = FAMILIES[family]
    config = getattr(transformers, cls)(**{**COMMON, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:  # gemma's norms apply (1 + w): random around 0 there, around 1 elsewhere
                p.copy_((0.0 if family.startswith("gemma") else 1.0) + 0.2 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
    model.save_pretrained(folder)
    return model


def assert_matches_transformers(model: Any, ref: Any) -> None:
    """The last position's logits within LOGIT_TOLERANCE and 5 greedy tokens equal to transformers'."""
    import torch

    with torch.no_grad():
        want_logits = ref(torch.tensor([IDS])).logits[0, -1].numpy()
        want = ref.generate(torch.tensor([IDS]), max_new_tokens=5, min_new_tokens=5, do_sample=False,
                            pad_token_id=0)[0, len(IDS):].tolist()
    got = model.next_logits(IDS)
    assert np.abs(got - want_logits).max() < LOGIT_TOLERANCE, np.abs(got - want_logits).max()
    assert model.generate(IDS, max_new_tokens=5, ignore_eos=True).token_ids == want


@pytest.mark.parametrize("family", list(FAMILIES))
def test_family_matches_transformers(tmp_path: Path, family: str) -> None:
    ref = write_family_model(tmp_path, family)
    model = edgerun.llm.load(tmp_path, context=64, chunk=8)
    assert model.config.arch == family
    assert_matches_transformers(model, ref)


# Families whose every attention ONNX Runtime runs as GroupQueryAttention (head_dim 16, full rotary): its
# window (mistral, gemma), soft-cap and query scale (gemma2), QK-norm before it and a second rotary base
# (gemma3). qwen3 (head_dim 24) and phi3 (partial rotary) run cache_attention's decomposition there.
ORT_FUSED = {"llama": 3, "mistral": 3, "gemma2": 3, "gemma3": 3, "qwen3": 0, "phi3": 0}


@pytest.mark.parametrize("family", list(ORT_FUSED))
def test_family_on_onnxruntime_matches_transformers(tmp_path: Path, family: str) -> None:
    """The same check with each method one ONNX Runtime partition: cache_attention as GroupQueryAttention
    (its local_window_size, softcap and scale) where it computes the op exactly, the decomposition elsewhere."""
    pytest.importorskip("onnxruntime")
    ref = write_family_model(tmp_path, family)
    model = edgerun.llm.load(tmp_path, context=64, chunk=8, backends=["onnxruntime"])
    for method in (model.runner.prefill, model.runner.decode):
        (compiled,) = method.parts.compiled
        assert compiled.backend == "onnxruntime" and compiled.info["fused_attentions"] == ORT_FUSED[family]
        # GroupQueryAttention appends in place; the decomposition's writes are copies written back.
        assert len(compiled.overwrites_inputs) == 2 * ORT_FUSED[family]
        assert len(method.parts.state.plan.copies) == 2 * (3 - ORT_FUSED[family])
    assert_matches_transformers(model, ref)


def test_unsupported_architectures_are_refused_naming_the_supported(tmp_path: Path) -> None:
    write_family_model(tmp_path, "llama")
    config = json.loads((tmp_path / "config.json").read_text())
    for change, message in [
        ({"model_type": "gpt_neox"}, "model_type 'gpt_neox' is not supported \\(supported: llama, mistral, qwen2, "
                                     "qwen3, phi3, gemma2, gemma3\\)"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}},
         "RoPE scaling 'yarn' is not supported \\(supported: default, linear, llama3\\)"),
        ({"hidden_act": "relu"}, "activation 'relu' is not supported for llama"),
    ]:
        (tmp_path / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(EdgerunError, match=message):
            edgerun.llm.load(tmp_path)
