"""Tiny llama GGUFs written here with gguf's writer (Q4_0, Q4_1, Q8_0, F16 and F32 tensors; Q4_K in a second
one): their packed weights run packed (matmul_int4, on the reference backend here), and their logits match
the float32 path and transformers loading the same file."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import pytest

import edgerun.llm
from edgerun.llm.checkpoint import load_checkpoint

DIM, HIDDEN, HEADS, KV_HEADS, LAYERS, VOCAB = 64, 96, 4, 2, 2, 128


def q4_k_blocks(rows: int, cols: int, rng: np.random.Generator, d: float | None = None) -> np.ndarray:
    """Q4_K super-blocks: every byte random (scales, minimums, codes) but `d` and `dmin`, finite float16s
    (random in [-2, 2], or `d` and d / 2). gguf cannot quantize to Q4_K, so tests write the blocks."""
    raw = rng.integers(0, 256, (rows, cols // 256, 144), dtype=np.uint8)
    scale = rng.uniform(-2, 2, (rows, cols // 256, 2)) if d is None else np.full((rows, cols // 256, 2), [d, d / 2])
    raw[:, :, 0:4] = scale.astype(np.float16).view(np.uint8).reshape(rows, cols // 256, 4)
    return raw.reshape(rows, -1)


def _llama_writer(path: Path, dim: int, hidden: int) -> gguf.GGUFWriter:
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(64)
    w.add_embedding_length(dim)
    w.add_feed_forward_length(hidden)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(VOCAB)
    w.add_rope_dimension_count(dim // HEADS)
    return w


def _finish(w: gguf.GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _write_packed_llama(path: Path, dim: int, hidden: int, rng: np.random.Generator,
                        projection: Callable[[str, int, int], tuple[np.ndarray, gguf.GGMLQuantizationType]]) -> None:
    """A tiny Llama GGUF whose seven projections per layer are `projection(name, rows, cols)`'s raw blocks and
    type; the embedding and norms float32."""
    w = _llama_writer(path, dim, hidden)
    w.add_tensor("token_embd.weight", (rng.standard_normal((VOCAB, dim)) * 0.2).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(dim, np.float32))
    hd = dim // HEADS
    for i in range(LAYERS):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(dim, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(dim, np.float32))
        for name, rows, cols in (("attn_q", HEADS * hd, dim), ("attn_k", KV_HEADS * hd, dim),
                                 ("attn_v", KV_HEADS * hd, dim), ("attn_output", dim, HEADS * hd),
                                 ("ffn_gate", hidden, dim), ("ffn_up", hidden, dim), ("ffn_down", dim, hidden)):
            raw, raw_dtype = projection(name, rows, cols)
            w.add_tensor(f"blk.{i}.{name}.weight", raw, raw_dtype=raw_dtype)
    _finish(w)


def write_tiny_gguf(path: Path, extra: dict[str, np.ndarray] | None = None) -> None:
    rng = np.random.default_rng(0)
    w = _llama_writer(path, DIM, HIDDEN)
    for name, data in (extra or {}).items():
        w.add_tensor(name, data)

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
    _finish(w)


def test_tiny_gguf_runs_and_matches_transformers(tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # Prefill with float inputs, so packed prefill equals the float32 path up to rounding; decode keeps
        # its int8 inputs (the default for both: test_packed_weights.py judges that on SmolLM2).
        model = edgerun.llm.load(path, context=32, chunk=8, int8_prefill=False)
        dense = edgerun.llm.load(path, dequantize=True, context=32, chunk=8)
    assert model.tokenizer is None and sorted({type(w).__name__ for w in load_checkpoint(path).weights.values()}) == \
        ["PackedWeight", "ndarray"]
    ops = model.runner.prefill.graph.op_counts()
    # 2 layers x (q, k, up: Q4_0; gate: Q4_1; v, down: Q8_0 as two nibble matmuls) + the Q8_0 head as two.
    assert ops["matmul_int4"] == 2 * 8 + 2 and "matmul_int4" not in dense.runner.prefill.graph.op_counts()
    ids = [3, 17, 99, 5, 64, 1, 2, 120, 7, 8, 44]
    ours = model.next_logits(ids)
    same = dense.next_logits(ids)
    np.testing.assert_allclose(ours, same, atol=1e-4)  # packed against float32: float rounding only
    # Decoding rounds the packed matmuls' inputs to int8 per group: close to float, not equal.
    step, step_dense = model.runner.forward([9]), dense.runner.forward([9])
    assert 0 < np.abs(step - step_dense).max() < 0.05 * np.abs(step_dense).max()
    import torch
    from transformers import AutoModelForCausalLM

    try:
        ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf", dtype=torch.float32).eval()
    except Exception as exc:  # transformers wants a tokenizer in some versions; the logits check needs none
        pytest.skip(f"transformers cannot load a GGUF without tokenizer metadata: {exc}")
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(ours, want, atol=1e-4)


def test_q4_k_weights_run_packed_and_match_the_float_path_and_transformers(tmp_path: Path) -> None:
    # Q4_K_M files, the usual download, are mostly Q4_K: read into the q4_1 form, they run packed.
    dim, hidden = 256, 512  # Q4_K rows are whole 256-value super-blocks
    rng = np.random.default_rng(5)
    path = tmp_path / "tiny-q4k.gguf"
    _write_packed_llama(path, dim, hidden, rng, lambda name, rows, cols: (
        q4_k_blocks(rows, cols, rng, d=0.0005), gguf.GGMLQuantizationType.Q4_K))
    model = edgerun.llm.load(path, context=32, chunk=8, int8_prefill=False)  # float prefill: exact up to rounding
    dense = edgerun.llm.load(path, dequantize=True, context=32, chunk=8)
    assert model.runner.prefill.graph.op_counts()["matmul_int4"] == LAYERS * 4  # q+k+v, o, gate+up, down
    ids = [3, 17, 99, 5, 64, 1, 2, 120, 7, 8, 44]
    ours = model.next_logits(ids)
    assert np.ptp(ours) > 0.5  # logits that spread: an atol of 1e-4 is a real check
    np.testing.assert_allclose(ours, dense.next_logits(ids), atol=1e-4)  # float rounding only
    import torch
    from transformers import AutoModelForCausalLM

    try:
        ref = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    except Exception as exc:  # transformers wants a tokenizer in some versions; the logits check needs none
        pytest.skip(f"transformers cannot load a GGUF without tokenizer metadata: {exc}")
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0, -1].numpy()
    np.testing.assert_allclose(ours, want, atol=1e-4)


@pytest.mark.parametrize("backends", [["reference"], ["onnxruntime"]])
def test_5_and_6_bit_weights_run_packed_and_match_the_float_path(tmp_path: Path, backends: list[str]) -> None:
    # Q4_K_M files carry Q6_K (ffn_down, attn_v) and often Q5_0 or Q5_K tensors: read as integer codes, they
    # run as two int4 matmuls each (Q6_K in groups of 16), on the reference kernels and on ONNX Runtime
    # (MatMulNBits, block_size 16 for Q6_K), and give the float path's logits.
    from .test_gguf import random_blocks

    dim, hidden = 256, 512
    rng = np.random.default_rng(7)
    path = tmp_path / "tiny-q56.gguf"
    kinds = {"attn_q": "Q5_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q5_0", "ffn_gate": "Q5_1",
             "ffn_up": "Q5_1", "ffn_down": "Q6_K"}
    scale = {"Q5_K": 0.0005, "Q6_K": 0.0005, "Q5_0": 0.002, "Q5_1": 0.002}
    _write_packed_llama(path, dim, hidden, rng, lambda name, rows, cols: (
        random_blocks(kinds[name], rows, cols, rng, d=scale[kinds[name]]), gguf.GGMLQuantizationType[kinds[name]]))
    model = edgerun.llm.load(path, context=32, chunk=8, int8_prefill=False, backends=backends)
    dense = edgerun.llm.load(path, dequantize=True, context=32, chunk=8, backends=backends)
    counts = model.runner.prefill.graph.op_counts()
    assert counts["matmul_int4"] == LAYERS * 7 * 2 and "matmul" in counts  # each projection two int4 matmuls
    assert {p.backend for p in model.runner.prefill.partitions} == set(backends)
    assert all(w.dtype != np.float32 or w.ndim < 2 for w in model.runner.prefill.graph.constants.values()
               if w.size > VOCAB * dim)  # no projection kept as float32
    ids = [3, 17, 99, 5, 64, 1, 2, 120, 7, 8, 44]
    ours = model.next_logits(ids)
    assert np.ptp(ours) > 0.5
    np.testing.assert_allclose(ours, dense.next_logits(ids), atol=2e-4)


def test_llama_3_rope_factors_in_a_gguf_equal_the_configs_llama3_scaling(tmp_path: Path) -> None:
    """Llama 3.1's RoPE scaling as llama.cpp's converter stores it (a factor per frequency, rope_freqs.weight)
    gives the model that the Hugging Face config's `rope_type: llama3` gives (architecture.py), on the same
    weights: an original context of 32 puts the 8 frequencies in all three bands."""
    import dataclasses
    import math

    from edgerun.llm.model import build_program, load_program, model_info
    from edgerun.llm.program_builder import inverse_frequencies

    factor, low, high, original = 8.0, 1.0, 4.0, 32.0
    hd = DIM // HEADS
    factors = []
    for freq in 1.0 / 10000.0 ** (np.arange(0, hd, 2) / hd):  # llama.cpp's convert_hf_to_gguf.py, as written
        wavelen = 2 * math.pi / freq
        smooth = (original / wavelen - low) / (high - low)
        factors.append(1.0 if wavelen < original / high else factor if wavelen > original / low
                       else 1 / ((1 - smooth) / factor + smooth))
    assert {f for f in factors if f not in (1.0, factor)} and {1.0, factor} <= set(factors)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, extra={"rope_freqs.weight": np.asarray(factors, np.float32)})
    checkpoint = load_checkpoint(path)
    from_gguf = checkpoint.config
    from_config = dataclasses.replace(from_gguf, rope_freq_factors=(), rope_scaling=(factor, low, high, original))
    np.testing.assert_allclose(inverse_frequencies(from_gguf, 1e4), inverse_frequencies(from_config, 1e4), rtol=1e-6)
    ids = [3, 17, 99, 5, 64, 1, 2, 120, 7, 8, 44]
    logits = []
    for config in (from_gguf, from_config):
        info = model_info(dataclasses.replace(checkpoint, config=config), 32, 8)
        program = load_program(build_program(checkpoint, info, dequantize=True), None)
        logits.append(program.method("prefill").run([np.asarray(ids[:8], np.int64), np.array([0]), np.array([7])])[0])
    write_tiny_gguf(path.with_name("plain.gguf"))
    plain = edgerun.llm.load(path.with_name("plain.gguf"), dequantize=True, context=32, chunk=8)
    np.testing.assert_allclose(logits[0], logits[1], atol=1e-5)
    assert np.abs(logits[0] - plain.next_logits(ids[:8])).max() > 1e-3  # the factors change the model
