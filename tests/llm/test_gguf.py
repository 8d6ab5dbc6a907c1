"""GGUF import: exact block unpacking against gguf's own dequantizer, metadata, and clear errors on bad files."""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgerun.errors import EdgerunError
from edgerun.llm import quant_blocks
from edgerun.llm.architecture import from_gguf_metadata
from edgerun.llm.checkpoint import load_checkpoint
from edgerun.llm.gguf_reader import read_gguf
from edgerun.llm.quant_blocks import (
    PackedWeight,
    unpack_blocks,
    unpack_q4_k,
    unpack_q5,
    unpack_q5_k,
    unpack_q6_k,
    wide_as_two_int4,
)

from .test_tiny_gguf import q4_k_blocks


@pytest.fixture(scope="module")
def contents(gguf_path: str):
    return read_gguf(gguf_path)


def test_real_file_tensors_dequantize_exactly_as_gguf_does(gguf_path: str, contents) -> None:
    reader = gguf.GGUFReader(gguf_path)
    seen = set()
    for t in reader.tensors:
        if t.tensor_type.name in seen and not t.name.startswith("blk.29"):
            continue
        seen.add(t.tensor_type.name)
        ours = contents.tensors[t.name]
        values = ours.dequantize() if isinstance(ours, PackedWeight) else ours
        ref = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.array_equal(values.reshape(ref.shape), ref), t.name
    assert seen == {"Q4_1", "Q8_0", "F32"}


def test_packed_representation(contents) -> None:
    w = contents.tensors["blk.0.ffn_up.weight"]
    assert isinstance(w, PackedWeight) and w.scheme == "q4_1" and w.bits == 4
    assert w.shape == (1536, 576) and w.data.shape == (1536, 288) and w.data.dtype == np.uint8
    assert w.scales.shape == w.mins.shape == (1536, 18)
    codes = w.codes()
    assert codes.max() <= 15 and codes.min() == 0
    assert w.nbytes < 1536 * 576  # well under one byte per weight


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q8_0"])
def test_every_packed_scheme_matches_gguf(qtype: str) -> None:
    rng = np.random.default_rng(0)
    data = rng.standard_normal((8, 128)).astype(np.float32)
    kind = gguf.GGMLQuantizationType[qtype]
    raw = gguf.quants.quantize(data, kind)
    packed = unpack_blocks(qtype.lower(), raw, (8, 128))
    assert np.array_equal(packed.dequantize(), gguf.quants.dequantize(raw, kind))
    assert np.abs(packed.dequantize() - data).max() < (0.3 if qtype != "Q8_0" else 0.03)


def test_architecture_from_metadata(contents) -> None:
    c = from_gguf_metadata(contents.metadata, 0)
    assert (c.arch, c.layers, c.dim, c.heads, c.kv_heads, c.hidden, c.vocab) == ("llama", 30, 576, 9, 3, 1536, 49152)
    assert c.head_dim == 64 and c.group == 3 and c.rope_theta == 100000.0


def test_checkpoint_unpermutes_q_rows_without_unpacking(gguf_path, contents) -> None:
    ckpt = load_checkpoint(gguf_path)
    raw_q = contents.tensors["blk.3.attn_q.weight"].dequantize()
    q = ckpt.float_weight("layers.3.q")
    # head 0: llama.cpp row 2i holds HF row i, row 2i+1 holds HF row 32+i
    assert np.array_equal(q[:32], raw_q[0:64:2]) and np.array_equal(q[32:64], raw_q[1:64:2])
    assert isinstance(ckpt.weights["layers.3.q"], PackedWeight) and ckpt.tied


def _write_gguf(path: Path, arch: str = "llama", tensors: dict | None = None, raw_type=None) -> None:
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    for name, array in (tensors or {"token_embd.weight": np.zeros((4, 32), np.float32)}).items():
        writer.add_tensor(name, array, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_bad_files_get_clear_errors(tmp_path: Path, gguf_path: str) -> None:
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(EdgerunError, match="not a GGUF file"):
        read_gguf(not_gguf)
    truncated = tmp_path / "truncated.gguf"
    with open(gguf_path, "rb") as f:
        truncated.write_bytes(f.read(2_000))  # cut inside the vocabulary
    with pytest.raises(EdgerunError, match="damaged or truncated"):
        read_gguf(truncated)
    with pytest.raises(EdgerunError, match="no model at"):
        load_checkpoint(tmp_path / "missing.gguf")


def test_unsupported_architecture_and_tensor_type(tmp_path: Path) -> None:
    gpt2 = tmp_path / "gpt2.gguf"
    _write_gguf(gpt2, arch="gpt2")
    with pytest.raises(EdgerunError, match="architecture 'gpt2' is not supported"):
        load_checkpoint(gpt2)
    q2 = tmp_path / "q2k.gguf"
    raw = np.zeros((4, 84), np.uint8)  # one 256-value Q2_K block per row
    _write_gguf(q2, tensors={"token_embd.weight": raw}, raw_type=gguf.GGMLQuantizationType.Q2_K)
    with pytest.raises(EdgerunError, match="tensor type Q2_K is not supported"):
        read_gguf(q2)


def test_q4_k_is_read_packed_into_the_q4_1_form_with_gguf_dequantizers_bits(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    raw = q4_k_blocks(5, 512, rng)
    w = unpack_q4_k(raw, (5, 512))
    assert w.scheme == "q4_1" and w.bits == 4 and w.data.shape == (5, 256) and w.scales.shape == (5, 16)
    kind = gguf.GGMLQuantizationType.Q4_K
    assert np.array_equal(w.dequantize(), gguf.quants.dequantize(raw, kind).reshape(5, 512))
    path = tmp_path / "q4k.gguf"
    _write_gguf(path, tensors={"token_embd.weight": raw}, raw_type=kind)
    read = read_gguf(path).tensors["token_embd.weight"]
    assert isinstance(read, PackedWeight) and np.array_equal(read.data, w.data)
    with pytest.raises(EdgerunError, match="Q4_K row length 300 is not a multiple of 256"):
        unpack_q4_k(raw, (5, 300))
    with pytest.raises(EdgerunError, match=r"Q4_K tensor of shape \(6, 512\) needs 1728 bytes, got 1440"):
        unpack_q4_k(raw, (6, 512))


# where each format keeps its float16 fields in a block: byte offsets (gguf cannot quantize to these types,
# so the tests write random blocks with finite float16s there)
HALF_FIELDS = {"Q5_0": (0,), "Q5_1": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,), "Q8_0": (0,)}


def random_blocks(qtype: str, rows: int, cols: int, rng: np.random.Generator, d: float | None = None) -> np.ndarray:
    """`qtype` blocks of a [rows, cols] matrix: every byte random but the float16 fields (random in [-2, 2],
    or `d`)."""
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[qtype]]
    raw = rng.integers(0, 256, (rows, cols // block, size), dtype=np.uint8)
    for at in HALF_FIELDS[qtype]:
        half = rng.uniform(-2, 2, (rows, cols // block)) if d is None else np.full((rows, cols // block), d)
        raw[:, :, at:at + 2] = half.astype(np.float16)[..., None].view(np.uint8)
    return raw.reshape(rows, -1)


_PACKED_READERS = {"Q6_K": unpack_q6_k, "Q5_K": unpack_q5_k, "Q5_0": functools.partial(unpack_q5, "q5_0"),
                   "Q5_1": functools.partial(unpack_q5, "q5_1")}


@pytest.mark.parametrize(("qtype", "scheme"), [("Q6_K", "q6_k"), ("Q5_K", "q5_1"), ("Q5_0", "q5_1"),
                                               ("Q5_1", "q5_1")])
def test_5_and_6_bit_formats_load_packed_with_gguf_dequantizers_bits(tmp_path: Path, qtype: str, scheme: str) -> None:
    # Kept as integer codes (one a byte) with float32 scales, never float32 values; dequantized, bit for bit
    # gguf's own dequantizer, every code value and sign of scale included.
    kind = gguf.GGMLQuantizationType[qtype]
    raw = random_blocks(qtype, 6, 512, np.random.default_rng(1))
    path = tmp_path / f"{qtype}.gguf"
    _write_gguf(path, tensors={"token_embd.weight": raw}, raw_type=kind)
    w = read_gguf(path).tensors["token_embd.weight"]
    assert isinstance(w, PackedWeight) and w.scheme == scheme and w.shape == (6, 512)
    assert w.data.dtype in (np.int8, np.uint8) and w.data.shape == (6, 512)
    assert w.nbytes <= 6 * 512 * 1.5  # against 4 bytes a value in float32
    codes = w.codes().astype(int)
    assert (codes.min(), codes.max()) == ((-32, 31) if qtype == "Q6_K" else (0, 31))
    assert np.array_equal(w.dequantize(), gguf.quants.dequantize(raw, kind).reshape(6, 512))
    with pytest.raises(EdgerunError, match=rf"{qtype} tensor of shape \(6, 512\) needs"):
        _PACKED_READERS[qtype](raw[:, :-1], (6, 512))


def test_wide_codes_split_into_two_int4_matmuls_equal_the_dequantized_weight(monkeypatch: pytest.MonkeyPatch) -> None:
    # The two int4 operand sets a 5- to 8-bit weight runs as (the codes' high and low nibbles) dequantize to
    # the weight exactly, groups of 16 for Q6_K; converted 3 rows at a time here (a partial last slice).
    monkeypatch.setattr(quant_blocks, "ROWS_AT_ONCE", 3)
    rng = np.random.default_rng(2)
    readers = {**_PACKED_READERS, "Q8_0": functools.partial(unpack_blocks, "q8_0")}
    for qtype, unpack in readers.items():
        w = unpack(random_blocks(qtype, 4, 256, rng), (4, 256))
        total = np.zeros((4, 256), np.float64)
        high, low = wide_as_two_int4(w)
        assert high.scales is low.scales and high.input_scale == 16  # one scales array for both halves
        for ops in (high, low):
            group = ops.packed.shape[2] * 2
            codes = np.stack([ops.packed & 0x0F, ops.packed >> 4], axis=-1).reshape(4, -1, group).astype(np.float64)
            zeros = 8 if ops.zeros is None else ops.zeros[..., None]
            part = (codes - zeros) * ops.scales[..., None]
            if ops.offsets is not None:
                part = part + ops.offsets[..., None]
            total += ops.input_scale * part.reshape(4, 256)
        assert np.array_equal(total, w.dequantize().astype(np.float64)), qtype
