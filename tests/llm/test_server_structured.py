"""Structured output through the server, with the real `openai` client: `response_format` json_schema and
json_object, a regex and a GBNF grammar. Answers are checked by what nobody here wrote: `json.loads` and the
`jsonschema` validator, `re.fullmatch`.

The served model is the tiny random llama, so nothing but the grammar makes its output JSON: every answer
parsing and validating is the constraint's work. The schemas bound their own length (patterns, enums,
integer ranges, maxItems) so that any path through them fits the context.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.llm.server_harness import running_server


@pytest.fixture(scope="module")
def client(tiny_chat: Any) -> Iterator[Any]:
    import openai

    from edgerun.llm.server import create_app
    from edgerun.llm.serving.config import ServerConfig

    with running_server(create_app(tiny_chat, ServerConfig(template_workers=1))) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def _value_schema(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    kinds = ["integer", "boolean", "enum", "pattern", "array"] + (["object"] if depth == 0 else [])
    kind = rng.choice(kinds)
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 500)}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", "north", "south", 7, None, True], rng.randint(1, 3))}
    if kind == "pattern":
        return {"type": "string", "pattern": f"^[a-{rng.choice('cfkz')}]{{1,{rng.randint(1, 6)}}}$"}
    if kind == "array":
        return {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
                "minItems": rng.randint(0, 1), "maxItems": rng.randint(1, 3)}
    return _object_schema(rng, depth + 1, rng.randint(1, 2))


def _object_schema(rng: random.Random, depth: int, size: int) -> dict[str, Any]:
    names = rng.sample(["id", "name", "ok", "size", "tags", "color", "where", "n"], size)
    properties = {n: _value_schema(rng, depth) for n in names}
    return {"type": "object", "properties": properties, "required": names, "additionalProperties": False}


def test_fifty_json_schemas_every_answer_parses_and_validates(client: Any, tiny_chat: Any) -> None:
    import jsonschema

    rng = random.Random(34)
    for i in range(50):
        schema = _object_schema(rng, 0, rng.randint(1, 3))
        jsonschema.Draft202012Validator.check_schema(schema)
        reply = client.chat.completions.create(
            model=tiny_chat.name, messages=[{"role": "user", "content": "Give JSON."}], max_tokens=90,
            temperature=1.0, seed=i,
            response_format={"type": "json_schema", "json_schema": {"name": f"s{i}", "schema": schema}})
        text = reply.choices[0].message.content
        assert reply.choices[0].finish_reason == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)


def test_a_streamed_schema_answer_and_greedy_decoding_validate(client: Any, tiny_chat: Any) -> None:
    import jsonschema

    schema = _object_schema(random.Random(7), 0, 3)
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    chunks = list(client.chat.completions.create(model=tiny_chat.name, messages=[{"role": "user", "content": "JSON"}],
                                                 max_tokens=90, temperature=0, stream=True, response_format=fmt))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    jsonschema.validate(json.loads(streamed), schema)
    whole = client.chat.completions.create(model=tiny_chat.name, messages=[{"role": "user", "content": "JSON"}],
                                           max_tokens=90, temperature=0, response_format=fmt)
    assert whole.choices[0].message.content == streamed
    # Without the constraint the same request is not JSON at all: the grammar made the difference.
    free = client.chat.completions.create(model=tiny_chat.name, messages=[{"role": "user", "content": "JSON"}],
                                          max_tokens=20, temperature=0)
    assert free.choices[0].message.content != streamed


def test_json_object_regex_and_grammar(client: Any, tiny_chat: Any) -> None:
    for seed in range(3):
        reply = client.chat.completions.create(
            model=tiny_chat.name, messages=[{"role": "user", "content": "An object."}], max_tokens=90, seed=seed,
            temperature=1.0, response_format={"type": "json_object"})
        text = reply.choices[0].message.content
        assert text.startswith("{")
        if reply.choices[0].finish_reason == "stop":  # an unbounded object may run out of tokens first
            assert isinstance(json.loads(text), dict)
    for seed in range(3):
        reply = client.completions.create(model=tiny_chat.name, prompt="Code:", max_tokens=20, seed=seed,
                                          temperature=1.0, extra_body={"regex": r"[0-9]{3}-[a-z]{2}"})
        assert re.fullmatch(r"[0-9]{3}-[a-z]{2}", reply.choices[0].text) and reply.choices[0].finish_reason == "stop"
    gbnf = 'root ::= answer " " number\nanswer ::= "yes" | "no"\nnumber ::= [1-9] [0-9]?'
    for seed in range(3):
        reply = client.completions.create(model=tiny_chat.name, prompt="Answer:", max_tokens=20, seed=seed,
                                          temperature=1.0, extra_body={"grammar": gbnf})
        assert re.fullmatch(r"(yes|no) [1-9][0-9]?", reply.choices[0].text)


def test_bad_structured_requests_get_clear_errors(client: Any, tiny_chat: Any) -> None:
    import openai

    bad = [
        ({"response_format": {"type": "xml"}}, "response_format.type must be"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}},
         "structured output"),
        ({"response_format": {"type": "json_object"}, "extra_body": {"regex": "a+"}}, "give one of"),
        ({"extra_body": {"grammar": "root ::= ("}}, "grammar"),
        ({"extra_body": {"regex": "a" * 100_001}}, "longer than this server's limit"),
    ]
    for args, message in bad:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model=tiny_chat.name, messages=[{"role": "user", "content": "x"}],
                                           max_tokens=5, **args)
        assert message in info.value.body["message"], (args, info.value.body)
    assert client.models.list().data[0].id == tiny_chat.name
