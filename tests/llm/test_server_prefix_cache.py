"""The prefix cache through the server: two conversations taking turns, where the model's one KV cache holds
only the other conversation when a turn arrives. A hit restores the earlier turn's whole prefill chunks
(fewer model calls, counted) and gives the same tokens as a fresh run without any cache (greedy and seeded
sampling); under a small budget old entries are evicted and the bytes stay within it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.llm.server_harness import running_server

SYSTEM = {"role": "system", "content": "You answer questions about geography, briefly and exactly, in English."}


def _serve(tiny_chat: Any, budget: int) -> Any:
    from edgerun.llm.server import create_app
    from edgerun.llm.serving.config import ServerConfig

    return create_app(tiny_chat, ServerConfig(template_workers=1, prefix_cache_bytes=budget))


@pytest.fixture(scope="module")
def served(tiny_chat: Any) -> Iterator[tuple[Any, Any]]:
    import openai

    app = _serve(tiny_chat, 64 << 20)
    with running_server(app) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120), app.state.engine


def _turn(client: Any, tiny_chat: Any, messages: list[dict[str, str]], **kw: Any) -> str:
    reply = client.chat.completions.create(model=tiny_chat.name, messages=messages, max_tokens=4, **kw)
    return str(reply.choices[0].message.content)


def _fresh(tiny_chat: Any, messages: list[dict[str, str]], **kw: Any) -> str:
    tiny_chat.reset()  # no cached row at all: the run a cache miss makes
    return str(tiny_chat.chat(messages, max_new_tokens=4, **kw).text)


def test_alternating_conversations_hit_and_match_a_fresh_run(served: tuple[Any, Any], tiny_chat: Any) -> None:
    client, engine = served
    chunk = tiny_chat.runner.chunk
    a = [SYSTEM, {"role": "user", "content": "What is the capital of France, and which river runs through it?"}]
    b = [{"role": "user", "content": "Name a large desert in Africa."}]
    a.append({"role": "assistant", "content": _turn(client, tiny_chat, a, temperature=0)})
    _turn(client, tiny_chat, b, temperature=0)  # the model's cache now holds b
    a.append({"role": "user", "content": "And of Italy?"})
    hits, restored = engine.prefix_cache.hits, engine.prefix_cache.restored_tokens
    answer = _turn(client, tiny_chat, a, temperature=0)
    job = engine.finished[-1]
    assert engine.prefix_cache.hits == hits + 1
    gained = engine.prefix_cache.restored_tokens - restored
    first_turn = tiny_chat.encode_prompt(tiny_chat.apply_chat_template(a[:2]))
    assert gained > 0 and gained % chunk == 0 and gained <= len(first_turn)
    # The cache held b, which shares no whole chunk with a: without the prefix cache every chunk runs.
    length = len(job.request.prompt_ids)
    assert job.prompt_steps == -(-(length - gained) // chunk) < -(-length // chunk)
    assert answer == _fresh(tiny_chat, a, temperature=0)
    # Seeded sampling reads the same logits, so it draws the same tokens too.
    _turn(client, tiny_chat, b, temperature=0)  # b's turn is a hit too (the direct run above left a)
    hits = engine.prefix_cache.hits
    sampled = _turn(client, tiny_chat, a, temperature=1.0, seed=5)
    assert engine.prefix_cache.hits == hits + 1
    assert sampled == _fresh(tiny_chat, a, temperature=1.0, seed=5)


def test_a_small_budget_evicts_the_oldest_and_stays_within_it(tiny_chat: Any) -> None:
    import openai

    per_token = 2 * tiny_chat.config.layers * tiny_chat.config.kv_heads * tiny_chat.config.head_dim * 4
    budget = 80 * per_token  # two 32-token entries fit, a third does not
    app = _serve(tiny_chat, budget)
    engine = app.state.engine
    with running_server(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        # About 39 tokens each: two whole chunks (32 tokens) kept per prompt.
        prompts = [f"Conversation {i}: " + "tell me about mountains and rivers " * 5 for i in range(4)]
        for p in prompts:
            client.completions.create(model=tiny_chat.name, prompt=p, max_tokens=2, temperature=0)
            assert engine.prefix_cache.bytes <= budget
        assert [len(k) for k in engine.prefix_cache.entries] == [32, 32]  # prompts 2 and 3
        hits = engine.prefix_cache.hits
        client.completions.create(model=tiny_chat.name, prompt=prompts[0] + "again", max_tokens=2, temperature=0)
        assert engine.prefix_cache.hits == hits  # evicted: computed again (and kept, evicting prompt 2)
        client.completions.create(model=tiny_chat.name, prompt=prompts[3] + "again", max_tokens=2, temperature=0)
        assert engine.prefix_cache.hits == hits + 1  # still kept
        assert engine.prefix_cache.bytes <= budget
