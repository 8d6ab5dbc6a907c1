"""The GGUF model run as edgerun programs against transformers on the same GGUF (both float32).

Greedy decoding must give the same tokens, and every step's logits must agree within LOGIT_TOLERANCE
(absolute, on logits of magnitude ~10-30). The full ten prompts x 32 tokens is the slow test; the quick one
takes two prompts x 8 tokens.
"""

from __future__ import annotations

import numpy as np
import pytest

LOGIT_TOLERANCE = 5e-4  # measured: at most ~5e-5

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
    "1, 2, 3, 4,",
    "The three primary colours are",
    "Translate to French: good morning",
    "import numpy as np\n\nx = np.",
    "Q: Why is the sky blue?\nA:",
    "My favourite food is",
]

_REFERENCE: dict[tuple[str, int], tuple[list[int], np.ndarray]] = {}


def reference(hf_model, ids: list[int], new: int) -> tuple[list[int], np.ndarray]:
    """transformers' greedy tokens and per-step logits, cached for the test session."""
    key = (",".join(map(str, ids)), new)
    if key not in _REFERENCE:
        import torch
        from transformers import GenerationConfig

        # No end-of-sequence token: both sides run all `new` steps (min_new_tokens would instead mask the
        # EOS logit on transformers' side only and change its greedy choice).
        config = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=2)
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([ids]), generation_config=config, output_logits=True,
                                    return_dict_in_generate=True)
        tokens = out.sequences[0, len(ids):].tolist()
        _REFERENCE[key] = (tokens, torch.stack(out.logits)[:, 0].numpy())
    return _REFERENCE[key]


def _compare(smollm, hf_model, prompts: list[str], new: int) -> float:
    worst = 0.0
    for prompt in prompts:
        ids = smollm.tokenizer.encode(prompt)
        tokens, logits = reference(hf_model, ids, new)
        result = smollm.generate(ids, max_new_tokens=new, ignore_eos=True, keep_logits=True)
        assert result.token_ids == tokens, prompt
        ours = np.stack(result.step_logits)
        worst = max(worst, float(np.abs(ours - logits).max()))
    assert worst < LOGIT_TOLERANCE
    return worst


def test_greedy_tokens_and_logits_match_transformers(smollm, hf_model) -> None:
    _compare(smollm, hf_model, PROMPTS[:2], 8)


@pytest.mark.slow
def test_ten_prompts_32_tokens_match_transformers(smollm, hf_model) -> None:
    _compare(smollm, hf_model, PROMPTS, 32)


def test_prompt_longer_than_a_chunk_matches_one_pass(smollm, hf_model) -> None:
    """A prompt spanning two prefill chunks (chunk 32, the second padded) gives transformers' logits."""
    ids = smollm.tokenizer.encode("The history of the city begins " * 8)[:45]
    import torch

    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0, -1].numpy()
    ours = smollm.next_logits(ids)
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() < LOGIT_TOLERANCE
