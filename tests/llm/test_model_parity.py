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
    """transformers' greedy decoding (the argmax of its logits each step, with its own KV cache) and the
    per-step logits, cached for the test session. Written as the loop rather than `generate()` so that no
    end-of-sequence stop or EOS-masking processor acts on one side only."""
    key = (",".join(map(str, ids)), new)
    if key not in _REFERENCE:
        import torch

        tokens, logits = [], []
        with torch.no_grad():
            out = hf_model(torch.tensor([ids]), use_cache=True)
            for step in range(new):
                step_logits = out.logits[0, -1]
                logits.append(step_logits.numpy().copy())
                tokens.append(int(step_logits.argmax()))
                if step + 1 < new:
                    out = hf_model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
        _REFERENCE[key] = (tokens, np.stack(logits))
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
    print(f"\n{len(prompts)} prompts x {new} tokens: largest logit difference {worst:.2e}")
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
