"""all-MiniLM-L6-v2 with its real weights: sentence embeddings from the edgerun program match
sentence-transformers' recipe in torch within 1e-5 cosine distance, on real sentences."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import edgerun
from edgerun.frontends.torch import export
from edgerun.zoo import minilm

sys.path.insert(0, str(Path(__file__).parent))
from zoo_checks import cosine_distance

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "A fast auburn fox leaps above a sleepy hound.",
    "Edge devices run compiled neural networks without Python.",
    "How do I bake sourdough bread at home?",
    "Stock markets fell sharply after the announcement.",
]


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    module = minilm.build()
    program = export(module, minilm.example_inputs(), name="minilm_l6")
    path = tmp_path_factory.mktemp("minilm") / "minilm.edgerun"
    program.save(path)
    return module, edgerun.load(path)


def _embed_both(embedder: tuple[Any, Any]) -> tuple[np.ndarray, np.ndarray]:
    module, loaded = embedder
    ours, theirs = [], []
    for sentence in SENTENCES:
        ids = minilm.tokenize([sentence])
        ours.append(loaded.run([t.numpy() for t in ids])[0][0])
        with torch.no_grad():
            theirs.append(module(*ids)[0].numpy())
    return np.stack(ours), np.stack(theirs)


def test_embeddings_match_torch_within_cosine_tolerance(embedder: tuple[Any, Any]) -> None:
    ours, theirs = _embed_both(embedder)
    assert ours.shape == (len(SENTENCES), 384)
    assert float(cosine_distance(ours, theirs).max()) <= 1e-5
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_real_weights_rank_paraphrases_closest(embedder: tuple[Any, Any]) -> None:
    ours, _ = _embed_both(embedder)
    similarity = ours @ ours.T
    assert similarity[0, 1] > 0.5
    assert similarity[0, 1] > max(similarity[0, 2], similarity[0, 3], similarity[0, 4]) + 0.2


def test_tokenizer_pads_to_a_fixed_length() -> None:
    ids, mask, types = minilm.tokenize(["short", "a somewhat longer sentence than the first one"], length=16)
    assert ids.shape == mask.shape == types.shape == (2, 16)
    assert int(mask[0].sum()) == 3 and ids[0, 0] == 101 and ids[0, 2] == 102  # [CLS] short [SEP]
