"""The batched decode (`load(..., slots=B)`, slot_batch.py): sequences joining and leaving a running batch,
each decoded one token per call in its own cache slot, give the tokens and logits each gives alone
(`generate`, the single-sequence decode) and transformers' greedy tokens and logits.

Tiny random models of two families on ONNX Runtime (families.py: gemma2's attention is GroupQueryAttention
over the batch, with its window and soft-caps; qwen3's head size runs the decomposition there) and SmolLM2 Q4_1 with real
weights, with float and with int8 activations (`int8_decode`, the default: the per-group int8 rounding turns
any last-bit difference between a batch row and the single decode into different logits, docs/llm.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgerun.llm
from edgerun.errors import EdgerunError
from edgerun.llm.slot_batch import SlotBatch

from .test_families import LOGIT_TOLERANCE, write_family_model

NEW = 6
PROMPTS = [[5, 17, 300, 42, 7, 99, 250, 3, 1, 64, 128, 11, 400], [9, 8, 7], [300, 200, 100, 50, 25, 12, 6, 3, 1],
           [42], [77, 66, 55, 44, 33, 22, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1]]
JOINS = [0, 0, 2, 3, 7]  # the step at which each prompt joins; the 5th takes the slot the first one leaves


def run_batch(model: Any, prompts: list[list[int]], joins: list[int], new: int) -> tuple[list[list[int]], list[list[np.ndarray]]]:
    """Greedy decoding of `prompts` through the batched decode, prompt i prefilled and joining at step joins[i]
    (into the first free slot), each leaving after `new` tokens: the tokens and the logits before each."""
    batch = SlotBatch(model.program, slots=model.slots, context=model.context)
    tokens: list[list[int]] = [[] for _ in prompts]
    logits: list[list[np.ndarray]] = [[] for _ in prompts]
    slot_of: dict[int, int] = {}
    pending: dict[int, np.ndarray] = {}
    step = 0
    while any(len(t) < new for t in tokens):
        for i, join in enumerate(joins):
            if join == step or (join < step and i not in slot_of and len(tokens[i]) < new and batch.free_slots()):
                if not batch.free_slots():
                    continue
                pending[i] = model.runner.run_prompt(prompts[i])
                slot_of[i] = batch.free_slots()[0]
                batch.admit(slot_of[i], len(prompts[i]))
        chosen = {}
        for i, row in pending.items():
            logits[i].append(row)
            tokens[i].append(int(np.argmax(row)))
            if len(tokens[i]) == new:
                batch.release(slot_of[i])
            else:
                chosen[i] = tokens[i][-1]
        rows = batch.step({slot_of[i]: t for i, t in chosen.items()}) if chosen else {}
        pending = {i: rows[slot_of[i]] for i in chosen}
        step += 1
    return tokens, logits


@pytest.mark.parametrize("family", ["gemma2", "qwen3"])
def test_sequences_in_a_batch_match_alone_and_transformers(tmp_path: Path, family: str) -> None:
    import torch

    ref = write_family_model(tmp_path, family)
    model = edgerun.llm.load(tmp_path, context=64, chunk=8, slots=4, backends=["onnxruntime"])
    assert model.slots == 4 and "decode_batch" in model.program.methods
    got_tokens, got_logits = run_batch(model, PROMPTS, JOINS, NEW)
    for prompt, tokens, logits in zip(PROMPTS, got_tokens, got_logits):
        alone = model.generate(prompt, NEW, ignore_eos=True, keep_logits=True)
        assert tokens == alone.token_ids
        for a, b in zip(logits, alone.step_logits):  # float32 matmuls of 4 rows against 1: other sum orders
            np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)
        with torch.no_grad():
            want = ref.generate(torch.tensor([prompt]), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                                pad_token_id=0, output_logits=True, return_dict_in_generate=True)
        assert tokens == want.sequences[0, len(prompt):].tolist()
        for a, b in zip(logits, want.logits):
            assert np.abs(a - b[0].numpy()).max() < LOGIT_TOLERANCE


def test_slot_misuse_is_refused(tmp_path: Path) -> None:
    write_family_model(tmp_path, "llama")
    model = edgerun.llm.load(tmp_path, context=16, chunk=8, slots=2)
    batch = SlotBatch(model.program, slots=2, context=16)
    model.runner.run_prompt([5, 6, 7])
    batch.admit(0, 3)
    with pytest.raises(EdgerunError, match="slot 0 is in use"):
        batch.admit(0, 3)
    with pytest.raises(EdgerunError, match="slot 1 holds no sequence"):
        batch.step({1: 5})
    with pytest.raises(EdgerunError, match="slots must be an integer from 1 to 64"):
        edgerun.llm.load(tmp_path, slots=0)
    per_sequence = 2 * 3 * 2 * 16 * 16 * 4  # k and v, 3 layers, 2 kv heads, 16 positions, head_dim 16, float32
    assert model.kv_cache_bytes == 3 * per_sequence
    fitted = edgerun.llm.load(tmp_path, context=16, chunk=8, slots=8, kv_cache_bytes=3 * per_sequence + 5)
    assert fitted.slots == 2 and fitted.kv_cache_bytes == 3 * per_sequence  # the prompt cache and 2 slots
    with pytest.raises(EdgerunError, match="over the KV-cache bound"):
        edgerun.llm.load(tmp_path, context=16, chunk=8, slots=8, kv_cache_bytes=per_sequence - 1)


@pytest.mark.parametrize("int8_decode", [True, False])
def test_smollm2_batch_of_eight_gives_each_prompts_tokens(gguf_path: str, int8_decode: bool) -> None:
    """SmolLM2 Q4_1 (real weights, packed 4-bit matmuls on ONNX Runtime), 8 prompts in 8 slots."""
    model = edgerun.llm.load(gguf_path, context=128, chunk=32, slots=8, int8_decode=int8_decode,
                             backends=["onnxruntime", "reference"])
    texts = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "1, 2, 3, 4,", "Water boils at",
             "The quick brown fox", "In 1969, the first", "My favourite colour is"]
    prompts = [model.encode_prompt(t) for t in texts]
    got_tokens, got_logits = run_batch(model, prompts, [0] * 8, 10)
    for prompt, tokens, logits in zip(prompts, got_tokens, got_logits):
        alone = model.generate(prompt, 10, ignore_eos=True, keep_logits=True)
        assert tokens == alone.token_ids
        assert max(float(np.abs(a - b).max()) for a, b in zip(logits, alone.step_logits)) < 1e-3
