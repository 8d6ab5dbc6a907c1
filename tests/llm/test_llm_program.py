"""The LLM as one program: methods `prefill` and `decode` sharing the weights and a KV cache held as program
state, written by update_slice at the run-time position (in place); `edgerun llm export` writes it as one file
that stores the weights once.

Most tests run the tiny GGUF of test_tiny_gguf.py on the reference backend (fast); the file-size test exports
the real SmolLM2 without loading it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import edgerun.llm
from edgerun.errors import EdgerunError
from edgerun.llm.program_builder import cache_names
from edgerun.llm.program_file import export_program
from edgerun.program import Program

from .test_tiny_gguf import LAYERS, write_tiny_gguf

CONTEXT, CHUNK = 32, 8
IDS = [3, 17, 99, 5, 64, 1, 2, 120, 7, 8, 44, 90, 12, 33, 71, 6, 100, 19, 27]  # 19: three chunks of 8


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-gguf") / "tiny.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="module")
def dense(tiny_gguf: Path) -> Any:
    """Float32 weights: prefill and decode compute the same function, so they can be compared exactly."""
    return edgerun.llm.load(tiny_gguf, dequantize=True, context=CONTEXT, chunk=CHUNK)


def step_by_step(model: Any, ids: list[int]) -> list[np.ndarray]:
    """The logits after each of `ids`, fed one token at a time through `decode` from an empty cache."""
    model.reset()
    return [model.runner.forward([i]) for i in ids]


STEPS = (IDS, [4], [9], IDS[:2], *[[i] for i in IDS[:8]])  # 19 + 1 + 1 + 2 + 8 = 31 of 32 cells


def test_onnxruntime_runs_each_layers_attention_and_cache_writes_as_one_kernel(dense: Any, tiny_gguf: Path) -> None:
    """On ONNX Runtime a whole step is one partition: each layer's attention and its two cache writes are one
    GroupQueryAttention (the cache_attention op, onnx_llm_ops.py) appending the new rows to the state's buffer in
    place (the partition declares the overwrite, the runtime binds the state to input and output); the logits
    and the cache stay the reference's, from an empty cache through prefill chunks to decode steps near the
    end of the context."""
    pytest.importorskip("onnxruntime")
    fast = edgerun.llm.load(tiny_gguf, dequantize=True, context=CONTEXT, chunk=CHUNK, backends=["onnxruntime"])
    for method in (fast.runner.prefill, fast.runner.decode):
        (compiled,) = method.parts.compiled
        assert compiled.backend == "onnxruntime" and compiled.info["fused_attentions"] == LAYERS
        assert sorted(compiled.overwrites_inputs.values()) == sorted(cache_names(dense.config))
        assert sorted(method.parts.state.plan.in_place) == sorted(cache_names(dense.config))
        assert not method.parts.state.plan.copies
    for model in (dense, fast):
        model.reset()
    for step in STEPS:
        np.testing.assert_allclose(fast.runner.forward(step), dense.runner.forward(step), atol=1e-4, rtol=0)
    for name, cache in dense.program.state.items():
        np.testing.assert_allclose(fast.program.state[name][:, :, :31], cache[:, :, :31], atol=1e-5, rtol=0)


def test_one_program_with_two_methods_and_the_cache_as_state(dense: Any) -> None:
    program = dense.program
    assert program.methods == ["prefill", "decode"]
    assert sorted(program.state) == sorted(cache_names(dense.config)) and len(program.state) == 2 * LAYERS
    for name, length in (("prefill", CHUNK), ("decode", 1)):
        method = program.method(name)
        assert method.graph.inputs == ["tokens", "start", "last"] and len(method.graph.outputs) == 1
        assert method.input_specs["tokens"].shape == (length,)
        # Each layer's attention is one op whose cache outputs are the layer's state updates.
        source = program.program.methods[name]
        attentions = [n for n in source.nodes if n.op == "cache_attention"]
        assert len(attentions) == LAYERS and not [n for n in source.nodes if n.op == "update_slice"]
        assert sorted(source.state_updates.values()) == sorted(o for n in attentions for o in n.outputs[1:])
        # Each state's new rows are written in place into its buffer: no copy of the cache per call.
        assert sorted(method.parts.state.plan.in_place) == sorted(program.state)
        assert not method.parts.state.plan.copies


def test_prefill_of_two_lengths_matches_decoding_token_by_token(dense: Any) -> None:
    for n in (5, len(IDS)):  # one padded chunk; two full chunks and a padded one
        want = step_by_step(dense, IDS[:n])
        want_cache = {k: v.copy() for k, v in dense.program.state.items()}
        dense.reset()
        np.testing.assert_allclose(dense.next_logits(IDS[:n]), want[-1], atol=1e-5)
        assert dense.runner.position == n
        for name, cache in dense.program.state.items():  # the same rows at the same positions
            assert cache.shape[:3] == (1, dense.config.kv_heads, dense.context)  # GroupQueryAttention's layout
            np.testing.assert_allclose(cache[:, :, :n], want_cache[name][:, :, :n], atol=1e-5)


def test_a_chunk_near_the_end_of_the_context_starts_earlier(dense: Any) -> None:
    """27 cached tokens plus 3: a chunk at 27 would not fit (update_slice would clamp it onto the wrong rows),
    so it runs from 24 and recomputes the three cached tokens it covers."""
    ids = (IDS * 2)[:30]
    want = step_by_step(dense, ids)
    dense.reset()
    dense.next_logits(ids[:27])
    got = dense.runner.forward(ids[27:])
    assert dense.runner.tokens == ids
    np.testing.assert_allclose(got, want[-1], atol=1e-5)
    np.testing.assert_allclose(dense.runner.forward([5]), dense.next_logits([*ids, 5]), atol=1e-5)


def test_reset_state_between_generations(dense: Any) -> None:
    first = dense.generate(IDS[:6], max_new_tokens=5, ignore_eos=True)
    assert np.abs(dense.program.state["k_cache_0"]).max() > 0
    dense.reset()
    assert dense.runner.position == 0 and all(not v.any() for v in dense.program.state.values())
    again = dense.generate(IDS[:6], max_new_tokens=5, ignore_eos=True)
    assert again.token_ids == first.token_ids
    # Another prompt straight after (no reset: the shared prefix is reused, stale rows masked) generates
    # what it does from a zeroed cache.
    other = dense.generate([*IDS[:4], 50, 51], max_new_tokens=5, ignore_eos=True)
    dense.reset()
    assert dense.generate([*IDS[:4], 50, 51], max_new_tokens=5, ignore_eos=True).token_ids == other.token_ids


def test_exported_file_runs_like_the_gguf(tiny_gguf: Path, tmp_path: Path) -> None:
    path = tmp_path / "tiny.edgerun"
    export_program(tiny_gguf, path, context=CONTEXT, chunk=CHUNK)
    loaded = edgerun.llm.load(path)
    direct = edgerun.llm.load(tiny_gguf, context=CONTEXT, chunk=CHUNK)
    assert loaded.program.methods == ["prefill", "decode"] and loaded.context == CONTEXT
    np.testing.assert_array_equal(loaded.next_logits(IDS), direct.next_logits(IDS))
    assert loaded.generate(IDS[:7], max_new_tokens=6, ignore_eos=True).token_ids == \
        direct.generate(IDS[:7], max_new_tokens=6, ignore_eos=True).token_ids
    with pytest.raises(EdgerunError, match="context of 32"):
        edgerun.llm.load(path, context=16)


def test_old_bundle_folder_is_refused(tmp_path: Path) -> None:
    (tmp_path / "llm.json").write_text('{"format": "edgerun-llm-bundle", "version": 1}')
    with pytest.raises(EdgerunError, match=r"edgerun-llm-bundle.*re-export"):
        edgerun.llm.load(tmp_path)


def test_a_program_that_is_not_an_llm_is_refused(tmp_path: Path) -> None:
    from edgerun.ir.builder import Builder
    from edgerun.ir.dtypes import DType
    from edgerun.ir.graph import Graph
    from edgerun.ir.tensor_spec import TensorSpec

    g = Graph()
    x = g.add_input("x", TensorSpec((2,), DType.float32))
    g.outputs = [Builder(g).unary("neg", x)]
    Program(g).save(tmp_path / "neg.edgerun")
    with pytest.raises(EdgerunError, match="not an LLM exported by `edgerun llm export`"):
        edgerun.llm.load(tmp_path / "neg.edgerun")


def test_real_model_file_stores_the_weights_once(gguf_path: str, tmp_path: Path) -> None:
    path = tmp_path / "smollm2.edgerun"
    export_program(gguf_path, path, context=512, chunk=32)
    program = Program.read(path)
    weights = {n: a.nbytes for g in program.methods.values() for n, a in g.constants.items()}
    once = sum(weights.values())
    # Both methods hold (nearly) every weight; the file holds them once, and the 60 zero cache states
    # (23.6 MB as arrays) as one segment. Measured: file = once + 0.1 MB.
    assert all(sum(a.nbytes for a in g.constants.values()) > 0.99 * once for g in program.methods.values())
    assert sum(a.nbytes for a in program.state.values()) > 20e6
    assert os.path.getsize(path) <= once + 4e6
    assert program.metadata["llm"]["model"]["context"] == 512
