"""The real SmolLM2 with its GGUF Q4_1/Q8_0 weights kept packed (matmul_int4), judged by logits against the
float32 path (weights dequantized), as the issue asks: not by greedy text, whose top two logits can sit 0.1
apart on this model.

- Prefill and decode (inputs rounded to int8 per group of 32, llama.cpp's Q8 activations, the default):
  DECODE_TOLERANCE, absolute on logits of magnitude 10-35, and DECODE_KL_TOLERANCE on the next-token
  distributions (much of the absolute error is a shift of all logits, which softmax ignores), each decode
  step fed the float32 path's greedy token so both see the same text.
- Prefill with float inputs (`int8_prefill=False`): the same function up to float rounding; PREFILL_TOLERANCE.
Measured figures are in docs/llm.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from edgerun.backends.onnxruntime.onnx_prepacked import shared_initializers

PREFILL_TOLERANCE = 1e-3  # measured: at most ~7e-5
DECODE_TOLERANCE = 2.0  # measured: at most ~1.2 (max over 49152 logits and 8 steps)
DECODE_KL_TOLERANCE = 0.02  # KL(float32 || packed) of the next-token distributions, nats; measured <= 0.007

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a land far away,",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def packed(gguf_path: str) -> Any:
    import edgerun.llm

    return edgerun.llm.load(gguf_path, context=256, chunk=32, backends=["onnxruntime"])


@pytest.fixture(scope="module")
def float_prefill(gguf_path: str) -> Any:
    import edgerun.llm

    return edgerun.llm.load(gguf_path, context=256, chunk=32, backends=["onnxruntime"], int8_prefill=False)


def test_weights_stay_packed_in_the_programs(packed: Any) -> None:
    for program in (packed.runner.prefill, packed.runner.decode):
        graph = program.graph
        int4 = [n for n in graph.nodes if n.op == "matmul_int4"]
        assert len(int4) == 30 * 4 + 2  # q+k+v, o, gate+up, down per layer; the tied Q8_0 head as two
        float_bytes = sum(c.nbytes for c in graph.constants.values() if c.dtype == np.float32)
        assert float_bytes < 60e6  # scales, Q4_1 offsets, norms, RoPE tables: no float weight (540 MB)
    for program in (packed.runner.prefill, packed.runner.decode):
        assert {n.attrs.get("activations") for n in program.graph.nodes if n.op == "matmul_int4"} == {"int8"}


def test_prefill_and_decode_run_on_one_onnxruntime_session(packed: Any, float_prefill: Any) -> None:
    """With int8 inputs in both methods, prefill (T = 32) and decode (T = 1) are one graph at two lengths:
    ONNX Runtime runs both on one session over a generic model, which prepacks the weights once
    (onnx_shape_variants.py; peak RSS in docs/llm.md). With float prefill inputs the graphs differ (each
    MatMulNBits' accuracy level) and each method keeps a session of its own."""
    def session(model: Any, method: str) -> Any:
        (compiled,) = getattr(model.runner, method).parts.compiled
        return compiled.run.__self__.session

    assert session(packed, "prefill") is session(packed, "decode")
    (decode,) = packed.runner.decode.parts.compiled
    assert decode.info["session_shared_by"] == 2
    tokens = next(i for i in session(packed, "decode").get_inputs() if i.name == "tokens")
    assert isinstance(tokens.shape[0], str)
    assert session(float_prefill, "prefill") is not session(float_prefill, "decode")


def test_the_whole_step_is_one_onnxruntime_partition_writing_the_cache_in_place(packed: Any) -> None:
    """Each method is one ONNX Runtime partition, each layer's attention and cache writes one
    GroupQueryAttention appending its new rows into the state's buffer, bound as both its past and present
    cache (CompiledPartition.overwrites_inputs): a call writes its new rows and nothing else."""
    state = packed.program.state
    for method in (packed.runner.prefill, packed.runner.decode):
        (compiled,) = method.parts.compiled
        assert compiled.backend == "onnxruntime" and compiled.info["fused_attentions"] == 30
        assert set(state) <= set(compiled.graph.inputs) and set(compiled.overwrites_inputs.values()) == set(state)
        assert all(np.shares_memory(method.parts.views[name], state[name]) for name in state)
        for update, read in compiled.overwrites_inputs.items():
            assert np.shares_memory(method.parts.views[update], state[read])
        assert sorted(method.parts.state.plan.in_place) == sorted(state)
        assert not method.parts.state.plan.copies
    # The program's initial cache is zeros in one element's memory: the state buffers are the only cache.
    assert all(not any(a.strides) and not a.any() for a in packed.program.program.state.values())


def test_onnxruntime_uses_the_packed_weights_in_place(packed: Any) -> None:
    """Both methods' ORT sessions take the program's packed operands as shared initializers (no copy per
    session; docs/llm.md, peak RSS), and the embedding is gathered from the tied head's nibble planes: no
    second int8 table."""
    for method in (packed.runner.prefill, packed.runner.decode):
        (compiled,) = [c for c in method.parts.compiled if c.backend == "onnxruntime"]
        codes = {n.inputs[1] for n in compiled.graph.nodes if n.op == "matmul_int4"}
        assert len(codes) == 30 * 4 + 2 and codes <= shared_initializers(compiled.run.__self__.session)
        assert not [name for name, c in method.graph.constants.items() if c.dtype == np.int8]


def test_the_host_lets_go_of_the_codes_onnxruntime_prepacked(packed: Any) -> None:
    """ONNX Runtime prepacks every MatMulNBits' codes (and, at accuracy level 4, its scales), so the program's
    arrays of them are released (runtime/constant_release.py) but for the tied head's planes and their
    scales, which the embedding Gather still reads;
    the Q4_1 offset matrices ([N, 18 or 48]) are a batched float MatMul's left-hand side, never prepacked,
    so the host keeps them. The logit tests here run on the released model."""
    program = packed.program.program
    graph = packed.runner.decode.graph
    codes = {n.inputs[1] for n in graph.nodes if n.op == "matmul_int4"}
    gathered = {v for n in graph.nodes if n.op != "matmul_int4" for v in n.inputs} & codes
    offsets = {n.inputs[0] for n in graph.nodes if n.op == "matmul" and n.inputs[0].endswith(".offsets")}
    assert len(offsets) == 30 * 4  # Q4_1 everywhere
    # MatMulNBits at accuracy level 4 folds the scales into its packed layout: theirs go too, but for the
    # head's, which the embedding Gather reads as well.
    scales = {n.inputs[2] for n in graph.nodes if n.op == "matmul_int4"}
    gathered_scales = {v for n in graph.nodes if n.op != "matmul_int4" for v in n.inputs} & scales
    assert len(gathered) == 2 and gathered_scales  # the gather scales its rows by the low plane's scales
    assert program.released == (codes - gathered) | (scales - gathered_scales)
    assert not offsets & program.released
    for method in program.methods.values():
        assert all(not any(method.constants[name].strides) for name in program.released)
        assert all(method.constants[name].strides[0] > 0 for name in gathered)


def test_packed_float_prefill_logits_match_float32(float_prefill: Any, smollm: Any) -> None:
    for prompt in PROMPTS:
        ids = smollm.tokenizer.encode(prompt)
        np.testing.assert_allclose(float_prefill.next_logits(ids), smollm.next_logits(ids),
                                   atol=PREFILL_TOLERANCE, err_msg=prompt)


def test_packed_int8_prefill_logits_close_to_float32(packed: Any, smollm: Any) -> None:
    for prompt in PROMPTS:
        ids = smollm.tokenizer.encode(prompt)
        got, expected = packed.next_logits(ids), smollm.next_logits(ids)
        err, kl = np.abs(got - expected).max(), kl_divergence(expected, got)
        assert err < DECODE_TOLERANCE and kl < DECODE_KL_TOLERANCE, (prompt, err, kl)


def test_packed_int8_decode_logits_close_to_float32(packed: Any, smollm: Any) -> None:
    for prompt in PROMPTS[:3]:
        ids = smollm.tokenizer.encode(prompt)
        want = smollm.generate(ids, max_new_tokens=8, ignore_eos=True, keep_logits=True)
        packed.next_logits(ids)
        for token, expected in zip(want.token_ids, want.step_logits[1:]):
            got = packed.runner.forward([token])
            err, kl = np.abs(got - expected).max(), kl_divergence(expected, got)
            assert err < DECODE_TOLERANCE and kl < DECODE_KL_TOLERANCE, (prompt, err, kl)


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    log_p, log_q = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(log_p) * (log_p - log_q)).sum())


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64) - x.max()
    return x - np.log(np.exp(x).sum())


def test_greedy_answer_does_not_depend_on_what_the_cache_held(packed: Any) -> None:
    """The same greedy request gives the same tokens and bit-identical logits on its first call, on a
    repeat (the cache holds its prompt and answer), after another conversation, and as a chat's second turn
    (the cache holds the first turn). Before, a repeat ran its last prompt token through decode's int8 GEMV
    and "Once upon a time there was a little" continued differently the second time."""
    def greedy(prompt: str | list[dict[str, str]]) -> tuple[list[int], np.ndarray]:
        r = packed.chat(prompt, max_new_tokens=6, keep_logits=True) if isinstance(prompt, list) \
            else packed.generate(prompt, max_new_tokens=6, ignore_eos=True, keep_logits=True)
        return r.token_ids, np.stack(r.step_logits)

    first_turn = [{"role": "user", "content": "Name a colour."}]
    second_turn = [*first_turn, {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"}]
    for prompt in ["Once upon a time there was a little", PROMPTS[3], second_turn]:
        packed.reset()
        fresh = greedy(prompt)
        repeat = greedy(prompt)
        greedy("The weather today")
        after_other = greedy(prompt)
        greedy(first_turn)
        after_prefix = greedy(prompt)
        for ids, logits in (repeat, after_other, after_prefix):
            assert ids == fresh[0], prompt
            np.testing.assert_array_equal(logits, fresh[1], err_msg=str(prompt))
