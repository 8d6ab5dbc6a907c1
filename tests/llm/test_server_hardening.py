"""The server's guards, from outside: the real `openai` client and raw HTTP against the server on loopback.

API keys, the body limit (refused before the body is read), prompt and stop-list bounds, max_tokens, the
model's id and alias, /health, Prometheus /metrics (read with prometheus_client's own parser), and a hostile
chat template that loops or allocates: stopped by its bounds while the server keeps answering.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.llm.server_harness import running_server

KEY = "sk-test-right-key"
ALIAS = "smollm-tiny"
MAX_BODY = 4096
MAX_PROMPT_CHARS = 1000


@pytest.fixture(scope="module")
def base(tiny_chat: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from edgerun.llm.server import create_app
    from edgerun.llm.serving.config import ServerConfig, read_api_keys

    key_file = tmp_path_factory.mktemp("keys") / "keys.txt"
    key_file.write_text(f"# keys, one a line\n{KEY}\n\nsk-another-key\n")
    config = ServerConfig(api_keys=read_api_keys(str(key_file)), aliases=(ALIAS,), max_body_bytes=MAX_BODY,
                          max_prompt_chars=MAX_PROMPT_CHARS, max_stop=4, max_stop_chars=20, max_tokens_limit=16,
                          template_workers=1)
    with running_server(create_app(tiny_chat, config)) as url:
        yield url


@pytest.fixture(scope="module")
def client(base: str) -> Any:
    import openai

    return openai.OpenAI(base_url=f"{base}/v1", api_key=KEY, max_retries=0, timeout=120)


def test_a_wrong_or_missing_key_is_refused_in_openais_form(base: str, tiny_chat: Any) -> None:
    import openai

    wrong = openai.OpenAI(base_url=f"{base}/v1", api_key="sk-wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as info:
        wrong.completions.create(model=tiny_chat.name, prompt="Hi", max_tokens=2)
    assert info.value.body["code"] == "invalid_api_key" and info.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    for headers in ({}, {"Authorization": KEY}, {"Authorization": f"Basic {KEY}"}):
        reply = httpx.get(f"{base}/v1/models", headers=headers, timeout=30)
        assert reply.status_code == 401 and reply.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{base}/metrics", timeout=30).status_code == 401
    assert httpx.get(f"{base}/health", timeout=30).json() == {"status": "ok"}  # a probe carries no key
    second = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer sk-another-key"}, timeout=30)
    assert second.status_code == 200


def test_the_model_answers_to_its_id_and_its_alias(client: Any, tiny_chat: Any) -> None:
    import openai

    assert [m.id for m in client.models.list().data] == [tiny_chat.name, ALIAS]
    by_id = client.completions.create(model=tiny_chat.name, prompt="Hello there", max_tokens=4, temperature=0)
    by_alias = client.completions.create(model=ALIAS, prompt="Hello there", max_tokens=4, temperature=0)
    assert by_alias.choices[0].text == by_id.choices[0].text == tiny_chat.generate("Hello there", 4).text
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="Hi", max_tokens=2)
    assert info.value.body["code"] == "model_not_found"


def _raw_request(base: str, head: bytes, body: bytes = b"") -> bytes:
    """Send `head` (and `body`) on a socket and read the whole response (the server closes the connection)."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(head + body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


def test_an_oversized_body_is_refused_before_it_is_read(base: str) -> None:
    # The headers announce 100 MB and no byte of it is sent: the answer can only come from the headers.
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: 100000000\r\n\r\n")
    reply = _raw_request(base, head)
    assert reply.startswith(b"HTTP/1.1 413 ")
    assert b'"code": "request_too_large"' in reply or b'"code":"request_too_large"' in reply
    # A chunked body has no length up front: it is counted as it arrives and refused once past the limit.
    chunk = b"x" * 3000
    body = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3)) + b"0\r\n\r\n"
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n")
    reply = _raw_request(base, head, body)
    assert reply.startswith(b"HTTP/1.1 413 ") and b"request_too_large" in reply


def test_prompt_stop_and_max_tokens_bounds(client: Any, tiny_chat: Any) -> None:
    import openai

    cases = [
        (dict(prompt="x" * (MAX_PROMPT_CHARS + 1)), "limit is 1000"),
        (dict(stop=["a", "b", "c", "d", "e"]), "at most 4 strings"),
        (dict(stop="y" * 21), "at most 20 characters"),
        (dict(max_tokens=0), "max_tokens must be between 1 and 16"),
        (dict(max_tokens=17), "max_tokens must be between 1 and 16"),
    ]
    for extra, message in cases:
        args = {"model": tiny_chat.name, "prompt": "Hi", "max_tokens": 2, **extra}
        with pytest.raises(openai.BadRequestError) as info:
            client.completions.create(**args)
        assert message in info.value.body["message"], (extra, info.value.body)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=tiny_chat.name, max_tokens=2,
                                       messages=[{"role": "user", "content": "z" * (MAX_PROMPT_CHARS + 1)}])
    assert "limit is 1000" in info.value.body["message"]
    # Without max_tokens a request gets the default cut to the per-request cap (16 here).
    reply = client.completions.create(model=tiny_chat.name, prompt="Hi", temperature=0)
    assert reply.usage.completion_tokens <= 16


def test_metrics_count_tokens_queue_batch_and_first_token_time(base: str, client: Any, tiny_chat: Any) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    def samples() -> dict[str, float]:
        text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {KEY}"}, timeout=30).text
        return {s.name + (str(sorted(s.labels.items())) if s.labels else ""): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    before = samples()
    reply = client.completions.create(model=tiny_chat.name, prompt="Once upon a time", max_tokens=5, temperature=0)
    after = samples()
    generated = reply.usage.completion_tokens
    assert after["edgerun_llm_generated_tokens_total"] - before["edgerun_llm_generated_tokens_total"] == generated
    assert after["edgerun_llm_prompt_tokens_total"] - before["edgerun_llm_prompt_tokens_total"] == \
        reply.usage.prompt_tokens
    assert after["edgerun_llm_time_to_first_token_seconds_count"] == \
        before["edgerun_llm_time_to_first_token_seconds_count"] + 1
    assert after["edgerun_llm_queue_depth"] == 0 and after["edgerun_llm_batch_size"] == 0
    assert after["edgerun_llm_decode_tokens_per_second"] > 0
    assert after["edgerun_llm_model_steps_total"] > before["edgerun_llm_model_steps_total"]


# A template that picks its misbehaviour from the message: 10^10 loop iterations, a 4 GB string, or a
# plain rendering.
HOSTILE = ("{% if messages[0]['content'] == 'loop' %}{% for a in range(100000) %}{% for b in range(100000) %}"
           "{% endfor %}{% endfor %}{% elif messages[0]['content'] == 'big' %}{{ 'a' * 4000000000 }}"
           "{% else %}{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% endif %}")


@pytest.fixture(scope="module")
def hostile_base(tiny_chat: Any) -> Iterator[str]:
    from edgerun.llm.model import LanguageModel
    from edgerun.llm.server import create_app
    from edgerun.llm.serving.config import ServerConfig

    # The tiny model's program with the hostile template. It never generates here (every request below
    # fails before), so it never touches the KV cache it shares with `tiny_chat`.
    hostile = LanguageModel(dataclasses.replace(tiny_chat.info, chat_template=HOSTILE), tiny_chat.tokenizer,
                            tiny_chat.program)
    config = ServerConfig(template_timeout_s=1.0, template_memory_bytes=400 << 20, template_workers=1)
    with running_server(create_app(hostile, config)) as url:
        yield url


def test_a_hostile_template_is_stopped_and_the_server_keeps_answering(hostile_base: str, tiny_chat: Any) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{hostile_base}/v1", api_key="none", max_retries=0, timeout=120)
    outcome: dict[str, Any] = {}

    def loop_request() -> None:
        try:
            client.chat.completions.create(model=tiny_chat.name, max_tokens=2,
                                           messages=[{"role": "user", "content": "loop"}])
        except openai.BadRequestError as exc:
            outcome["error"] = exc.body["message"]

    looping = threading.Thread(target=loop_request)
    looping.start()
    # While the template loops (it is stopped after 1 s at the earliest), /v1/models answers.
    answered_while_looping = 0
    while looping.is_alive():
        assert [m.id for m in client.models.list().data] == [tiny_chat.name]
        answered_while_looping += looping.is_alive()
        time.sleep(0.05)
    looping.join()
    assert "did not finish within 1 s" in outcome["error"]
    assert answered_while_looping >= 1
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=tiny_chat.name, max_tokens=2, messages=[{"role": "user", "content": "big"}])
    assert "memory bound" in info.value.body["message"]
    # A fresh worker renders the next template: this request gets as far as the context check, after rendering.
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=tiny_chat.name, max_tokens=128,
                                       messages=[{"role": "user", "content": "hello"}])
    assert "exceeds the context" in info.value.body["message"]
