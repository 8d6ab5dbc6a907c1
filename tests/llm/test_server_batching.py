"""Continuous batching in the real server on loopback: requests join the running batch as slots free up and
leave it when they end, a newcomer's prompt is prefilled between the running requests' decode steps, a
client that leaves frees its slot within one step, and every answer is the one the request gets alone.

A tiny random llama (SmolLM2's vocabulary and template) loaded with 4 slots; its answers are checked against
the same weights loaded without a batched decode (`generate`, one sequence at a time). The engine is paced by
a gate it calls before every model call, so the tests count model calls instead of timing anything.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import edgerun.llm
from edgerun.errors import EdgerunError
from tests.llm.server_harness import StepGate, running_server, wait_until

SLOTS = 4


@pytest.fixture(scope="module")
def batched(tiny_chat_dir: Path) -> Any:
    return edgerun.llm.load(tiny_chat_dir, context=128, chunk=16, slots=SLOTS)


@pytest.fixture()
def served(batched: Any) -> Iterator[tuple[str, Any, StepGate]]:
    from edgerun.llm.server import create_app
    from edgerun.llm.serving.config import ServerConfig

    gate = StepGate()
    app = create_app(batched, ServerConfig(max_queue=16, template_workers=1, prefix_cache_bytes=0), step_gate=gate)
    with running_server(app) as url:
        yield url, app.state.engine, gate
        gate.open()


def greedy_completion(url: str, model: str, prompt: str, max_tokens: int) -> str:
    """One whole (not streamed) greedy completion's text, through the server."""
    return httpx.post(f"{url}/v1/completions", timeout=120, json={
        "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}).json()["choices"][0]["text"]


def leaving_stream_body(model: str) -> dict[str, Any]:
    """A long streamed request whose client the tests cut off after its first chunk."""
    return {"model": model, "prompt": "Leave", "max_tokens": 100, "temperature": 0, "stream": True}


def test_requests_join_and_leave_the_running_batch(served: tuple[str, Any, StepGate], tiny_chat: Any) -> None:
    import openai

    url, engine, gate = served
    asks = [("Request zero: the capital of France is", 14), ("One", 9), ("Two plus two", 11), ("Three", 12),
            ("A fourth request that waits for a slot", 8), ("Five", 10)]
    expected = [tiny_chat.generate(prompt, max_new_tokens=n).text for prompt, n in asks]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    answers: dict[int, str] = {}

    def call(i: int) -> None:
        prompt, n = asks[i]
        if i % 2:  # streamed and whole alike
            pieces = client.completions.create(model=tiny_chat.name, prompt=prompt, max_tokens=n, temperature=0,
                                               stream=True)
            answers[i] = "".join(chunk.choices[0].text for chunk in pieces if chunk.choices)
        else:
            answers[i] = client.completions.create(model=tiny_chat.name, prompt=prompt, max_tokens=n,
                                                   temperature=0).choices[0].text

    gate.hold()
    threads = []
    for i in range(len(asks)):  # admitted in this order (first come, first served)
        threads.append(threading.Thread(target=call, args=(i,)))
        threads[-1].start()
        wait_until(lambda n=i + 1: len(engine.admitted()) == n, "the request was not admitted")
    jobs = engine.admitted()
    gate.open()
    for t in threads:
        t.join(120)
    assert answers == dict(enumerate(expected))
    assert all(job.outcome in ("stop", "length") for job in jobs)
    assert max(job.largest_batch for job in jobs) == SLOTS
    # The first four join one after another, each prefilled between the decode steps of those before it.
    assert [job.joined_at for job in jobs[:4]] == sorted(job.joined_at for job in jobs[:4])
    assert all(jobs[i].joined_at < jobs[0].left_at for i in range(1, 4))
    # The last two wait for a slot: each joins once a running request has left, while others still run.
    for late in jobs[4:]:
        assert any(job.left_at <= late.joined_at for job in jobs[:4])
        assert any(job.left_at > late.joined_at for job in jobs if job is not late)
    # Shared decode calls: fewer model calls than the requests took part in.
    assert engine.steps < sum(job.steps for job in jobs)


def test_a_client_that_leaves_frees_its_slot_within_one_step(served: tuple[str, Any, StepGate],
                                                             tiny_chat: Any) -> None:
    url, engine, gate = served
    expected = tiny_chat.generate("Stay", max_new_tokens=30).text
    gate.hold()
    answers: dict[str, str] = {}

    def stay() -> None:
        answers["stay"] = greedy_completion(url, tiny_chat.name, "Stay", 30)

    body = leaving_stream_body(tiny_chat.name)
    thread = threading.Thread(target=stay)
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{url}/v1/completions", json=body) as stream:
        wait_until(lambda: len(engine.admitted()) == 1, "the stream was not admitted")
        (leaving,) = engine.admitted()
        thread.start()
        wait_until(lambda: len(engine.admitted()) == 2, "the second request was not admitted")
        staying = engine.admitted()[-1]
        gate.allow(8)  # two prompts' chunks and six decode steps, the two requests decoding together
        lines = stream.iter_lines()  # (kept: a dropped iterator closes the response)
        assert next(line for line in lines if line.startswith("data: "))
        wait_until(lambda: gate.waiting and engine.steps == 8, "the engine did not use its 8 steps")
        steps = leaving.steps
    wait_until(leaving.cancelled.is_set, "the server did not see the client go")
    gate.open()
    thread.join(120)
    assert leaving.outcome == "cancelled" and leaving.steps == steps  # no call after the cancel
    assert leaving.largest_batch == 2 and staying.outcome in ("stop", "length")
    assert answers["stay"] == expected
    assert engine.admitted() == [] and engine.metrics.batch_size._value.get() == 0


def test_waiting_prompts_are_prefilled_up_to_the_budget_between_decode_steps(batched: Any, tiny_chat: Any) -> None:
    """`prefill_chunks=2`: two newcomers' one-chunk prompts, then a decode step of those running, then the next
    two; every answer still the one the request gets alone."""
    from edgerun.llm.server import create_app
    from edgerun.llm.serving.config import ServerConfig

    asks = [("One", 6), ("Two plus two", 5), ("Three", 7), ("Four", 4)]
    expected = [tiny_chat.generate(prompt, max_new_tokens=n).text for prompt, n in asks]
    gate = StepGate()
    app = create_app(batched, ServerConfig(max_queue=16, template_workers=1, prefix_cache_bytes=0, prefill_chunks=2),
                     step_gate=gate)
    answers: dict[int, str] = {}
    with running_server(app) as url:
        engine = app.state.engine

        def call(i: int) -> None:
            answers[i] = greedy_completion(url, tiny_chat.name, *asks[i])

        gate.hold()
        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(asks))]
        for i, thread in enumerate(threads):
            thread.start()
            wait_until(lambda n=i + 1: len(engine.admitted()) == n, "the request was not admitted")
        jobs = engine.admitted()
        gate.open()
        for thread in threads:
            thread.join(120)
    assert answers == dict(enumerate(expected))
    assert all(len(job.request.prompt_ids) <= batched.info.chunk for job in jobs)  # one prefill call each
    # Steps 1 and 2: the first two prompts; 3: their decode step; 4 and 5: the next two prompts; 6: four decode.
    assert [job.joined_at for job in jobs] == [1, 2, 4, 5]
    assert [job.largest_batch for job in jobs] == [4] * 4
    with pytest.raises(EdgerunError, match="prefill_chunks must be >= 1"):
        ServerConfig(prefill_chunks=0).check()


def test_a_client_that_leaves_during_anothers_prefill_frees_its_slot_before_that_call(
        served: tuple[str, Any, StepGate], tiny_chat: Any) -> None:
    """A running stream cut while the engine waits to prefill a newcomer leaves the batch before that prefill
    call, not at the next decode step."""
    url, engine, gate = served
    expected = tiny_chat.generate("Stay", max_new_tokens=5).text
    gate.hold()
    answers: dict[str, str] = {}

    def stay() -> None:
        answers["stay"] = greedy_completion(url, tiny_chat.name, "Stay", 5)

    body = leaving_stream_body(tiny_chat.name)
    thread = threading.Thread(target=stay)
    with httpx.Client(timeout=60) as http, http.stream("POST", f"{url}/v1/completions", json=body) as stream:
        wait_until(lambda: len(engine.admitted()) == 1, "the stream was not admitted")
        (leaving,) = engine.admitted()
        gate.allow(2)  # its prompt, then a decode step; the engine then waits before another decode step
        wait_until(lambda: gate.waiting and engine.steps == 2, "the engine did not use its 2 steps")
        thread.start()
        wait_until(lambda: len(engine.admitted()) == 2, "the second request was not admitted")
        staying = engine.admitted()[-1]
        gate.allow(1)  # that decode step; then the engine waits before the newcomer's prefill call
        wait_until(lambda: gate.waiting and engine.steps == 3, "the engine did not use its step")
        lines = stream.iter_lines()  # (kept: a dropped iterator closes the response)
        assert next(line for line in lines if line.startswith("data: "))
    wait_until(leaving.cancelled.is_set, "the server did not see the client go")
    gate.open()
    thread.join(120)
    assert leaving.outcome == "cancelled" and leaving.steps == 3
    assert leaving.left_at == 3 and staying.joined_at == 4  # gone before the newcomer's prefill call
    assert staying.largest_batch == 1 and answers["stay"] == expected
    assert engine.admitted() == []
