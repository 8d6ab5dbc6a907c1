"""The OpenAI-compatible server on loopback, called with the real `openai` client and raw HTTP.

The served model is a tiny random llama with SmolLM2's tokenizer and chat template (fast); the answers are
compared with the same model's Python API, so the server's path is what is tested.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest


@pytest.fixture(scope="module")
def server(tiny_chat) -> Iterator[str]:
    import uvicorn

    from edgerun.llm.server import create_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(create_app(tiny_chat), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not srv.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    srv.should_exit = True
    thread.join(10)


@pytest.fixture(scope="module")
def client(server: str):
    import openai

    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0, timeout=120)


def test_models(client, tiny_chat) -> None:
    assert [m.id for m in client.models.list().data] == [tiny_chat.name]


def test_chat_completion_matches_the_python_api(client, tiny_chat) -> None:
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    reply = client.chat.completions.create(model=tiny_chat.name, messages=messages, max_tokens=6, temperature=0)
    direct = tiny_chat.chat(messages, max_new_tokens=6)
    assert reply.choices[0].message.content == direct.text
    assert reply.choices[0].message.role == "assistant"
    assert reply.usage.completion_tokens == len(direct.token_ids)


def test_streamed_chat_and_completion(client, tiny_chat) -> None:
    messages = [{"role": "user", "content": "Count to five."}]
    stream = client.chat.completions.create(model=tiny_chat.name, messages=messages, max_tokens=8, temperature=0,
                                            stream=True)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == tiny_chat.chat(messages, max_new_tokens=8).text
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    pieces = list(client.completions.create(model=tiny_chat.name, prompt="The capital of France is", max_tokens=5,
                                            temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == tiny_chat.generate("The capital of France is",
                                                                         max_new_tokens=5).text


def test_a_stream_asked_for_its_usage_ends_with_it(client, server, tiny_chat) -> None:
    messages = [{"role": "user", "content": "Count to five."}]
    whole = client.chat.completions.create(model=tiny_chat.name, messages=messages, max_tokens=7, temperature=0)
    chunks = list(client.chat.completions.create(model=tiny_chat.name, messages=messages, max_tokens=7,
                                                 temperature=0, stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1]) and chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) == whole.choices[0].message.content
    pieces = list(client.completions.create(model=tiny_chat.name, prompt="The capital of France is", max_tokens=5,
                                            temperature=0, stream=True, stream_options={"include_usage": True}))
    once = client.completions.create(model=tiny_chat.name, prompt="The capital of France is", max_tokens=5,
                                     temperature=0)
    assert pieces[-1].choices == [] and pieces[-1].usage.model_dump() == once.usage.model_dump()
    # Without it, no chunk has a usage; and stream_options on a request that does not stream is an error.
    plain = list(client.completions.create(model=tiny_chat.name, prompt="The capital of France is", max_tokens=5,
                                           temperature=0, stream=True))
    assert all(p.usage is None for p in plain) and len(plain) == len(pieces) - 1
    reply = httpx.post(f"{server}/completions", json={"model": tiny_chat.name, "prompt": "Hi", "max_tokens": 2,
                                                       "stream_options": {"include_usage": True}}, timeout=60)
    assert reply.status_code == 400 and "stream_options" in reply.json()["error"]["message"]


def test_completion_with_stop(client, tiny_chat) -> None:
    full = tiny_chat.generate("The capital of France is", max_new_tokens=6).text
    reply = client.completions.create(model=tiny_chat.name, prompt="The capital of France is", max_tokens=6,
                                      temperature=0, stop=[full[4:7]])
    assert reply.choices[0].text == full[:full.index(full[4:7])] and reply.choices[0].finish_reason == "stop"


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(client, server, tiny_chat) -> None:
    import openai

    bad = [dict(temperature=-1), dict(top_p=1.5), dict(prompt=""), dict(max_tokens=0),
           dict(prompt="word " * 300)]
    for extra in bad:
        args = {"model": tiny_chat.name, "prompt": "Hi", "max_tokens": 2, **extra}
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(**args)
        assert info.value.body["message"]  # OpenAI's error object: message, type, param, code
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=tiny_chat.name, messages=[{"role": "robot", "content": "x"}], max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="Hi", max_tokens=2)
    raw = httpx.post(f"{server}/chat/completions", json={"messages": "not a list"}, timeout=30)
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    assert client.completions.create(model=tiny_chat.name, prompt="Hi", max_tokens=2, temperature=0).choices[0].text


def test_concurrent_requests_are_queued_not_interleaved(client, tiny_chat) -> None:
    prompts = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
    expected = [tiny_chat.generate(p, max_new_tokens=4).text for p in prompts]
    results: dict[int, str] = {}

    def call(i: int) -> None:
        r = client.completions.create(model=tiny_chat.name, prompt=prompts[i], max_tokens=4, temperature=0)
        results[i] = r.choices[0].text

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [results[i] for i in range(3)] == expected
