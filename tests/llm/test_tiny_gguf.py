"""A tiny llama GGUF written here with gguf's writer (Q4_0, Q8_0, F16 and F32 tensors): it loads, warns that
packed weights run dequantized for now, and its logits match transformers loading the same file."""

from __future__ import annotations

import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest

import edgerun.llm

DIM, HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB = 64, 96, 4, 2, 2, 128


def write_tiny_gguf(path: Path) -> None:
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(64)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_rope_dimension_count(DIM // HEADS)

    def add(name: str, shape: tuple[int, ...], qtype: str) -> None:
        data = (rng.standard_normal(shape) * (0.2 if len(shape) == 2 else 0.1) + (1.0 if "norm" in name else 0))
        data = data.astype(np.float32)
        if qtype in ("F32", "F16"):
            w.add_tensor(name, data.astype(np.float16 if qtype == "F16" else np.float32))
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)

    add("token_embd.weight", (VOCAB, DIM), "Q8_0")
    add("output_norm.weight", (DIM,), "F32")
    hd = DIM // HEADS
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", (DIM,), "F32")
        add(f"blk.{i}.ffn_norm.weight", (DIM,), "F32")
        add(f"blk.{i}.attn_q.weight", (HEADS * hd, DIM), "Q4_0")
        add(f"blk.{i}.attn_k.weight", (KV_HEADS * hd, DIM), "Q4_0")
        add(f"blk.{i}.attn_v.weight", (KV_HEADS * hd, DIM), "Q8_0")
        add(f"blk.{i}.attn_output.weight", (DIM, HEADS * hd), "F16")
        add(f"blk.{i}.ffn_gate.weight", (HIDDEN, DIM), "Q4_1")
        add(f"blk.{i}.ffn_up.weight", (HIDDEN, DIM), "Q4_0")
        add(f"blk.{i}.ffn_down.weight", (DIM, HIDDEN), "Q8_0")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_tiny_gguf_runs_and_matches_transformers(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    with pytest.warns(UserWarning, match="run dequantized to float32"):
        model = edgerun.llm.load(path, context=32, chunk=8)
    assert model.tokenizer is None and sorted({type(w).__name__ for w in model.checkpoint.weights.values()}) == \
        ["PackedWeight", "ndarray"]
    ids = [3, 17, 99, 5, 64, 1, 2, 120, 7, 8, 44]
    ours = model.next_logits(ids)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = edgerun.llm.load(path, dequantize=True, context=32, chunk=8).next_logits(ids)
    np.testing.assert_array_equal(ours, same)
    import torch
    from transformers import AutoModelForCausalLM

    try:
        ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    except Exception as exc:  # transformers wants a tokenizer in some versions; the logits check needs none
        pytest.skip(f"transformers cannot load a GGUF without tokenizer metadata: {exc}")
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(ours, want, atol=1e-4)
