"""Hugging Face model folders (config.json + safetensors written offline by save_pretrained): llama and
qwen2 (biases on q/k/v, untied head), logits against transformers, and backends="auto" through the runtime."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import edgerun.llm
from edgerun.errors import EdgerunError

from .conftest import write_tiny_model

IDS = [5, 17, 300, 42, 7, 99, 250, 3, 1, 64, 128, 11, 400]


def _reference_logits(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].numpy()


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_folder_logits_and_greedy_match_transformers(tmp_path: Path, model_type: str) -> None:
    ref = write_tiny_model(tmp_path, model_type)
    model = edgerun.llm.load(tmp_path, context=64, chunk=8)
    assert model.tokenizer is None and model.config.arch == model_type
    assert model.config.qkv_bias == (model_type == "qwen2")
    np.testing.assert_allclose(model.next_logits(IDS), _reference_logits(ref, IDS), atol=1e-4)
    import torch

    with torch.no_grad():
        want = ref.generate(torch.tensor([IDS]), max_new_tokens=6, min_new_tokens=6, do_sample=False,
                            pad_token_id=0)[0, len(IDS):].tolist()
    assert model.generate(IDS, max_new_tokens=6, ignore_eos=True).token_ids == want


def test_backends_auto_runs_the_programs(tmp_path: Path) -> None:
    ref = write_tiny_model(tmp_path, "llama")
    model = edgerun.llm.load(tmp_path, context=32, chunk=8, backends="auto")
    np.testing.assert_allclose(model.next_logits(IDS), _reference_logits(ref, IDS), atol=1e-4)
    assert model.runner.decode.partitions  # a real LoadedProgram, placed by the search


def test_unsupported_configs_are_refused(tmp_path: Path) -> None:
    write_tiny_model(tmp_path, "llama")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "gpt_neox"}))
    with pytest.raises(EdgerunError, match="model_type 'gpt_neox' is not supported"):
        edgerun.llm.load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({**config, "rope_scaling": {"rope_type": "yarn",
                                                                                  "factor": 4.0}}))
    with pytest.raises(EdgerunError, match="RoPE scaling"):
        edgerun.llm.load(tmp_path)
    (tmp_path / "config.json").unlink()
    with pytest.raises(EdgerunError, match=r"no config\.json"):
        edgerun.llm.load(tmp_path)


def test_every_eos_of_the_generation_config_stops(tmp_path: Path) -> None:
    """A generation_config.json listing several eos ids (Llama 3's end of text, of turn, of message): each
    ends generation, and greedy text stops right before the first of them."""
    write_tiny_model(tmp_path, "llama")
    free = edgerun.llm.load(tmp_path, context=32, chunk=8).generate(IDS, max_new_tokens=6, ignore_eos=True)
    stops = [free.token_ids[3], 500, 501]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": stops}))
    model = edgerun.llm.load(tmp_path, context=32, chunk=8)
    assert model.stop_token_ids == set(stops)
    result = model.generate(IDS, max_new_tokens=6)
    assert result.token_ids == free.token_ids[:free.token_ids.index(stops[0])] and result.finish_reason == "stop"
