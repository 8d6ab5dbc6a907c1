"""Generation options and bad input on the real model: sampling, seeds, stop strings and tokens, streaming,
prefix reuse, context overflow."""

from __future__ import annotations

import pytest

from edgerun.errors import EdgerunError
from edgerun.llm.sampling import SamplingParams, next_token

PROMPT = "The capital of France is"


def test_greedy_is_deterministic_and_result_has_the_contract(smollm) -> None:
    a = smollm.generate(PROMPT, max_new_tokens=5)
    b = smollm.generate(smollm.tokenizer.encode(PROMPT), max_new_tokens=5, temperature=0.0)
    assert a.token_ids == b.token_ids and len(a.token_ids) == 5
    assert a.text == smollm.tokenizer.decode(a.token_ids) and "Paris" in a.text
    assert a.finish_reason == "length" and a.prompt_tokens == len(smollm.tokenizer.encode(PROMPT))


def test_sampling_follows_the_seed(smollm) -> None:
    kw = dict(max_new_tokens=6, temperature=1.2, top_k=50, top_p=0.95, min_p=0.01, repetition_penalty=1.1)
    first = smollm.generate(PROMPT, seed=7, **kw)
    assert smollm.generate(PROMPT, seed=7, **kw).token_ids == first.token_ids
    others = {tuple(smollm.generate(PROMPT, seed=s, **kw).token_ids) for s in (1, 2, 3)}
    assert len(others | {tuple(first.token_ids)}) > 1


def test_sampler_filters() -> None:
    import numpy as np

    logits = np.array([5.0, 4.0, 1.0, -3.0], np.float32)
    rng = np.random.default_rng(0)
    picks = {next_token(logits, SamplingParams(temperature=1.0, top_k=2), [], rng) for _ in range(200)}
    assert picks == {0, 1}
    picks = {next_token(logits, SamplingParams(temperature=1.0, top_p=0.5), [], rng) for _ in range(50)}
    assert picks == {0}
    picks = {next_token(logits, SamplingParams(temperature=1.0, min_p=0.5), [], rng) for _ in range(50)}
    assert picks == {0}
    # a strong repetition penalty on token 0 hands greedy to token 1
    assert next_token(logits, SamplingParams(repetition_penalty=2.0), [0], rng) == 1


def test_stop_strings_and_streaming(smollm) -> None:
    full = smollm.generate(PROMPT, max_new_tokens=8)
    stop = full.text[3:6]
    pieces: list[str] = []
    cut = smollm.generate(PROMPT, max_new_tokens=8, stop=[stop], on_text=pieces.append)
    assert cut.finish_reason == "stop" and cut.text == full.text[:full.text.index(stop)]
    assert "".join(pieces) == cut.text
    streamed: list[str] = []
    again = smollm.generate(PROMPT, max_new_tokens=8, on_text=streamed.append)
    assert "".join(streamed) == again.text == full.text and len(streamed) > 1


def test_stop_token_ends_without_it(smollm) -> None:
    full = smollm.generate(PROMPT, max_new_tokens=4)
    stopped = smollm.generate(PROMPT, max_new_tokens=4, stop_token_ids=[full.token_ids[2]])
    assert stopped.token_ids == full.token_ids[:2] and stopped.finish_reason == "stop"


def test_chat_stops_at_end_of_turn(smollm) -> None:
    result = smollm.chat([{"role": "user", "content": "Say hello."}], max_new_tokens=40)
    assert result.finish_reason == "stop" and result.text and "<|im_end|>" not in result.text
    assert 2 not in result.token_ids


def test_stop_tokens_come_from_the_checkpoint(smollm) -> None:
    """eos from the GGUF metadata and the chat template's end of turn (found by rendering it), not a string
    written in the code: SmolLM2's eos is <|im_end|>, which its template closes a turn with."""
    assert smollm.end_of_turn_id == smollm.tokenizer.token_id("<|im_end|>") == smollm.info.special["eos"]
    assert smollm.stop_token_ids == {smollm.info.special["eos"]}


def test_prefix_reuse_gives_the_same_answer(smollm) -> None:
    smollm.runner.reset()
    fresh = smollm.generate(PROMPT + " a city", max_new_tokens=4)
    smollm.generate(PROMPT + " the", max_new_tokens=2)  # leaves a cache sharing the prompt's prefix
    assert smollm.generate(PROMPT + " a city", max_new_tokens=4).token_ids == fresh.token_ids


@pytest.mark.parametrize("kwargs, message", [
    ({"top_p": 1.5}, "top_p"), ({"temperature": -1.0}, "temperature"), ({"top_k": -2}, "top_k"),
    ({"min_p": 2.0}, "min_p"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"max_new_tokens": 0}, "max_new_tokens"), ({"stop": [""]}, "stop"),
])
def test_invalid_sampling_values(smollm, kwargs, message) -> None:
    with pytest.raises(EdgerunError, match=message):
        smollm.generate(PROMPT, **{"max_new_tokens": 2, **kwargs})


def test_empty_prompt_and_context_overflow(smollm) -> None:
    with pytest.raises(EdgerunError, match="empty"):
        smollm.generate("", max_new_tokens=2)
    with pytest.raises(EdgerunError, match="empty"):
        smollm.generate([], max_new_tokens=2)
    with pytest.raises(EdgerunError, match="vocabulary"):
        smollm.generate([10**7], max_new_tokens=2)
    long_prompt = "word " * 300  # ~300 tokens, the fixture's context is 256
    with pytest.raises(EdgerunError, match="exceeds the context of 256"):
        smollm.generate(long_prompt, max_new_tokens=2)
    with pytest.raises(EdgerunError, match="exceeds the context"):
        smollm.generate(PROMPT, max_new_tokens=256)
    assert smollm.generate(PROMPT, max_new_tokens=2).token_ids  # still works afterwards
