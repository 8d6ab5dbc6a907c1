"""Clients that leave, and a full queue, against the real server on loopback.

The engine is paced by a gate it calls before every model call (server_harness.StepGate), so the tests count
model calls (steps) instead of timing anything: a request whose client left makes no model call after the
cancel is seen, 16 abandoned streams cost an honest request no step at all, and a held engine lets the queue
and token bounds be reached exactly.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.llm.server_harness import StepGate, running_server, wait_until


@pytest.fixture(scope="module")
def served(tiny_chat: Any) -> Iterator[tuple[str, Any, StepGate]]:
    from edgerun.llm.server import create_app
    from edgerun.llm.serving.config import ServerConfig

    gate = StepGate()
    app = create_app(tiny_chat, ServerConfig(max_queue=32, template_workers=1), step_gate=gate)
    with running_server(app) as url:
        yield url, app.state.engine, gate
    gate.open()


def _admitted(engine: Any, n: int) -> list[Any]:
    wait_until(lambda: len(engine.admitted()) >= n, f"{n} requests were not admitted")
    return engine.admitted()


def test_abandoned_streams_cost_an_honest_request_no_step(served: tuple[str, Any, StepGate], tiny_chat: Any) -> None:
    url, engine, gate = served
    expected = tiny_chat.generate("The capital of France is", max_new_tokens=8)
    gate.hold()
    abandoned = []
    with httpx.Client(timeout=60) as http:
        for i in range(16):
            body = {"model": tiny_chat.name, "max_tokens": 60, "stream": True,
                    "messages": [{"role": "user", "content": f"Tell me a long story, number {i}."}]}
            with http.stream("POST", f"{url}/v1/chat/completions", json=body) as stream:
                first = next(stream.iter_lines())  # the role chunk, sent before any model call
                assert json.loads(first.removeprefix("data: "))["choices"][0]["delta"]["role"] == "assistant"
                abandoned.append(engine.admitted()[-1])
            # Leaving the `with` closes the connection mid-stream: the client is gone.
    wait_until(lambda: all(job.cancelled.is_set() for job in abandoned), "the server did not see the clients go")
    steps_before = engine.steps
    gate.open()
    reply = httpx.post(f"{url}/v1/completions", timeout=60, json={
        "model": tiny_chat.name, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}).json()
    assert reply["choices"][0]["text"] == expected.text
    wait_until(lambda: all(job.outcome == "cancelled" for job in abandoned), "abandoned requests did not end")
    honest = engine.finished[-1]
    assert honest.outcome in ("stop", "length") and honest.request.prompt_ids == tiny_chat.encode_prompt(
        "The capital of France is")
    # The bound: the abandoned streams made no model call, so every step since the gate opened was the
    # honest request's own (its prompt chunks and a decode step per token after the first).
    assert [job.steps for job in abandoned] == [0] * 16
    assert engine.steps - steps_before == honest.steps <= 1 + len(expected.token_ids)


def test_a_stream_cut_mid_generation_stops_within_one_step(served: tuple[str, Any, StepGate], tiny_chat: Any) -> None:
    url, engine, gate = served
    gate.hold()
    body = {"model": tiny_chat.name, "prompt": "Once upon a time", "max_tokens": 100, "temperature": 0,
            "stream": True}
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{url}/v1/completions", json=body) as stream:
        (job,) = _admitted(engine, 1)
        gate.allow(12)  # the prompt's chunk and 11 decode steps; then the engine waits at the gate
        lines = stream.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        wait_until(lambda: gate.waiting and job.steps == 12, "the engine did not use its 12 steps")
    wait_until(job.cancelled.is_set, "the server did not see the client go")
    gate.allow(100)
    wait_until(lambda: job.outcome == "cancelled", "the request did not end")
    assert job.steps == 12  # none after the cancel; without it the request had 88 more to go
    gate.open()


def test_a_plain_request_whose_client_left_never_runs(served: tuple[str, Any, StepGate], tiny_chat: Any) -> None:
    url, engine, gate = served
    gate.hold()
    body = json.dumps({"model": tiny_chat.name, "prompt": "Hello", "max_tokens": 50}).encode()
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        (job,) = _admitted(engine, 1)
    wait_until(job.cancelled.is_set, "the server did not see the client go")
    gate.open()
    wait_until(lambda: job.outcome == "cancelled", "the request did not end")
    assert job.steps == 0


def test_a_full_queue_and_a_spent_token_budget_are_refused_in_openais_form(tiny_chat: Any) -> None:
    import openai

    from edgerun.llm.server import create_app
    from edgerun.llm.serving.config import ServerConfig

    gate = StepGate()
    gate.hold()
    app = create_app(tiny_chat, ServerConfig(max_queue=2, max_pending_tokens=40, template_workers=1),
                     step_gate=gate)
    engine = app.state.engine
    with running_server(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
        answers: dict[int, str] = {}

        def call(i: int, max_tokens: int) -> None:
            reply = client.completions.create(model=tiny_chat.name, prompt=f"Request {i}", max_tokens=max_tokens,
                                              temperature=0)
            answers[i] = reply.choices[0].text

        threads = []
        for i, max_tokens in enumerate((20, 10, 5)):  # one running (held at the gate), two waiting
            threads.append(threading.Thread(target=call, args=(i, max_tokens)))
            threads[-1].start()
            _admitted(engine, i + 1)
        with pytest.raises(openai.RateLimitError) as info:
            call(3, 1)
        assert info.value.body["code"] == "queue_full" and info.value.response.headers["retry-after"] == "1"
        engine.max_queue = 3  # room in the queue, but 20 + 10 + 5 + 6 new tokens pass the budget of 40
        with pytest.raises(openai.InternalServerError) as overloaded:
            call(4, 6)
        assert overloaded.value.status_code == 503 and overloaded.value.body["code"] == "overloaded"
        call_5 = threading.Thread(target=call, args=(5, 5))  # 20 + 10 + 5 + 5 = 40 fits exactly
        call_5.start()
        _admitted(engine, 4)
        gate.open()
        for t in [*threads, call_5]:
            t.join(120)
        assert sorted(answers) == [0, 1, 2, 5]
        assert answers[2] == tiny_chat.generate("Request 2", max_new_tokens=5).text
