"""LanguageModel: a checkpoint's LLM program loaded through the runtime, with its tokenizer and chat template.

    model = edgerun.llm.load("SmolLM2-135M-Instruct.Q4_1.gguf")   # or a file from `edgerun llm export`
    model.generate("The capital of France is", max_new_tokens=16).text
    model.chat([{"role": "user", "content": "Hi!"}], on_text=print)

The program (`build_program`) has two methods, `prefill` (a chunk of tokens) and `decode` (one token), sharing
the weights and the KV cache, which is program state. GGUF Q4_0/Q4_1/Q8_0 weights run packed (matmul_int4);
`dequantize=True` runs float32 weights instead. Loaded with `slots=B` it also has `decode_batch` (one token
for each of B sequences in one call, each in its own cache slot) and `commit_slot` (the prefilled cache into
a slot): slot_batch.py runs them.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.llm.architecture import Architecture
from edgerun.llm.chat_template import render_chat
from edgerun.llm.checkpoint import Checkpoint, load_checkpoint
from edgerun.llm.generation import GenerationResult, TextCallback, run_generation
from edgerun.llm.program_builder import (
    PROJECTIONS,
    Weight,
    batched_decode_graph,
    cache_specs,
    slot_cache_names,
    slot_commit_graph,
    step_graph,
)
from edgerun.llm.quant_blocks import PackedWeight
from edgerun.llm.sampling import SamplingParams
from edgerun.llm.step_runner import StepRunner
from edgerun.llm.tokenizer import Tokenizer, tokenizer_from_gguf, tokenizer_from_json
from edgerun.program import Program
from edgerun.program.program import default_metadata
from edgerun.runtime import LoadedProgram
from edgerun.runtime.constant_release import release_constants

DEFAULT_CONTEXT = 2048  # cache positions (the KV-cache state has this many)
DEFAULT_CHUNK = 64  # the prefill method's static length
MAX_SLOTS = 64  # sequences a batched decode may run at once


@dataclass(frozen=True)
class GenerationRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    params: SamplingParams
    stop: list[str]
    stop_token_ids: set[int]


@dataclass(frozen=True)
class ModelInfo:
    name: str
    source: str
    digest: str
    config: Architecture
    context: int
    chunk: int
    chat_template: str | None
    special: dict[str, int]


class LanguageModel:
    def __init__(self, info: ModelInfo, tokenizer: Tokenizer | None, program: LoadedProgram) -> None:
        # No checkpoint is kept: the program holds the weights it runs (stacked q/k/v and gate/up are copies
        # of the file's tensors), so a kept checkpoint would be a second copy of most weights in memory.
        self.info, self.tokenizer, self.program = info, tokenizer, program
        self.config = info.config
        self.context = info.context
        self.runner = StepRunner(program, chunk=info.chunk, context=info.context)
        self._lock = threading.Lock()  # one KV cache: one generation at a time

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def kv_cache_bytes(self) -> int:
        """Memory the KV caches take: the single-sequence cache and the batched decode's slots."""
        state = self.program.program.state if self.program.program is not None else {}
        return sum(int(v.size) * v.dtype.itemsize for v in state.values())

    @property
    def slots(self) -> int:
        """Sequences the batched decode runs in one call (`load(..., slots=B)`); 1: no batched decode."""
        names = slot_cache_names(self.config)[:1]
        state = self.program.program.state if self.program.program is not None else {}
        return int(state[names[0]].shape[0]) if names and names[0] in state else 1

    @property
    def eos_token_id(self) -> int | None:
        return self.info.special.get("eos")

    @functools.cached_property
    def stop_token_ids(self) -> frozenset[int]:
        """Where generation ends unless `ignore_eos` (`stop_token_ids` below). Found once: it renders the
        chat template, which no request should pay for (or be exposed to) again."""
        return frozenset(stop_token_ids(self.info, self.tokenizer))

    @functools.cached_property
    def end_of_turn_id(self) -> int | None:
        return end_of_turn_id(self.info, self.tokenizer)

    def encode_prompt(self, prompt_or_ids: str | Sequence[int]) -> list[int]:
        if isinstance(prompt_or_ids, str):
            if self.tokenizer is None:
                raise EdgerunError("this model has no tokenizer; pass token ids")
            ids = self.tokenizer.encode(prompt_or_ids)
        else:
            ids = [int(i) for i in prompt_or_ids]
            bad = [i for i in ids if not 0 <= i < self.config.vocab]
            if bad:
                raise EdgerunError(f"token ids {bad[:5]} are outside the vocabulary of {self.config.vocab}")
        if not ids:
            raise EdgerunError("the prompt is empty")
        return ids

    def generate(self, prompt_or_ids: str | Sequence[int], max_new_tokens: int = 128, temperature: float = 0.0, *,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 seed: int | None = None, stop: str | Sequence[str] | None = None,
                 stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False,
                 on_text: TextCallback | None = None, keep_logits: bool = False) -> GenerationResult:
        """Continue the prompt. `on_text` receives the new text piece by piece as it is decoded."""
        request = self.prepare(prompt_or_ids, max_new_tokens, temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                               repetition_penalty=repetition_penalty, seed=seed, stop=stop,
                               stop_token_ids=stop_token_ids, ignore_eos=ignore_eos)
        with self._lock:
            return run_generation(self.runner, self.tokenizer, request.prompt_ids,
                                  max_new_tokens=request.max_new_tokens, params=request.params, stop=request.stop,
                                  stop_token_ids=request.stop_token_ids, on_text=on_text, keep_logits=keep_logits)

    def prepare(self, prompt_or_ids: str | Sequence[int], max_new_tokens: int = 128, temperature: float = 0.0, *,
                top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                seed: int | None = None, stop: str | Sequence[str] | None = None,
                stop_token_ids: Sequence[int] | None = None, ignore_eos: bool = False) -> GenerationRequest:
        """Check a request without running it (the server does this before it starts a stream)."""
        params = SamplingParams(temperature, top_k, top_p, min_p, repetition_penalty, seed)
        params.check()
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise EdgerunError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        if any(not isinstance(s, str) or not s for s in stops):
            raise EdgerunError("stop strings must be non-empty strings")
        ids = self.encode_prompt(prompt_or_ids)
        if len(ids) + max_new_tokens > self.context:
            raise EdgerunError(f"the prompt ({len(ids)} tokens) plus max_new_tokens ({max_new_tokens}) exceeds "
                               f"the context of {self.context} tokens")
        stop_ids = {int(i) for i in (stop_token_ids or [])}
        if not ignore_eos:
            stop_ids |= self.stop_token_ids
        return GenerationRequest(ids, max_new_tokens, params, stops, stop_ids)

    def apply_chat_template(self, messages: Any, add_generation_prompt: bool = True) -> str:
        special = template_tokens(self.info, self.tokenizer) if self.tokenizer is not None else {}
        return render_chat(self.info.chat_template, messages, add_generation_prompt=add_generation_prompt,
                           special_tokens=special)

    def chat(self, messages: Any, max_new_tokens: int = 256, **kwargs: Any) -> GenerationResult:
        """Answer the conversation `messages` ([{"role", "content"}, ...]) through the chat template."""
        return self.generate(self.apply_chat_template(messages), max_new_tokens, **self.chat_kwargs(kwargs))

    def chat_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """generate() arguments for a chat turn: the template's end-of-turn token stops it, even with
        `ignore_eos`."""
        stop_ids = list(kwargs.get("stop_token_ids") or [])
        end = self.end_of_turn_id
        if end is not None:
            stop_ids.append(end)
        return {**kwargs, "stop_token_ids": stop_ids}

    def reset(self) -> None:
        """Forget the cached conversation and put the KV-cache state back to zeros (not needed between
        generations, which reuse the common prefix and mask the rest; a clean start for snapshots/tests)."""
        with self._lock:
            self.runner.reset()
            self.program.reset_state()

    def next_logits(self, ids: Sequence[int]) -> np.ndarray:
        """[vocab] logits after the last of `ids`, run as a fresh sequence (for comparisons; resets the cache)."""
        ids = self.encode_prompt(ids)
        with self._lock:
            self.runner.reset()
            return self.runner.forward(ids)


def load(path_or_gguf: str | os.PathLike[str], dequantize: bool = False, *, context: int | None = None,
         chunk: int = DEFAULT_CHUNK, backends: Sequence[str] | str | None = None,
         int8_decode: bool = True, int8_prefill: bool = True, slots: int = 1,
         kv_cache_bytes: int | None = None) -> LanguageModel:
    """Load a GGUF file, a Hugging Face model folder, or a program file written by `edgerun llm export`.

    GGUF Q4_0/1, Q5_0/1, Q8_0, Q4_K, Q5_K, Q6_K weights run packed unless `dequantize`; `int8_decode` and `int8_prefill`
    (see build_program) apply to them. An exported file runs as it was exported (its context, chunk and
    weights). `backends="auto"` lets the search place each method. `slots` > 1 adds the batched decode over
    that many sequences (build_program); with `kv_cache_bytes` as few as fit that bound beside the
    single-sequence cache (an error if not even that fits).
    """
    path = os.fspath(path_or_gguf)
    from edgerun.llm.program_file import is_program_file, load_program_file

    if not isinstance(slots, int) or isinstance(slots, bool) or not 1 <= slots <= MAX_SLOTS:
        raise EdgerunError(f"slots must be an integer from 1 to {MAX_SLOTS}, got {slots!r}")
    if is_program_file(path):
        if slots > 1:
            raise EdgerunError("a program file runs as it was exported: load the GGUF or model folder for slots > 1")
        return load_program_file(path, backends=backends, dequantize=dequantize, context=context)
    checkpoint = load_checkpoint(path)
    info, tokenizer = model_info(checkpoint, context, chunk), checkpoint_tokenizer(checkpoint)
    if kv_cache_bytes is not None:
        slots = fitting_slots(info, slots, kv_cache_bytes)
    program = build_program(checkpoint, info, dequantize, int8_decode, int8_prefill, slots)
    del checkpoint  # freed before the program loads: ONNX Runtime's sessions then reuse its memory
    return LanguageModel(info, tokenizer, load_program(program, backends))


def sequence_cache_bytes(info: ModelInfo) -> int:
    """The KV cache of one sequence at the model's context: every layer's keys and values, float32."""
    return sum(4 * int(np.prod(spec.shape)) for spec in cache_specs(info.config, info.context, "heads").values())


def fitting_slots(info: ModelInfo, slots: int, kv_cache_bytes: int) -> int:
    """At most `slots` batched-decode slots, as many as fit `kv_cache_bytes` with the single-sequence cache
    (1: no batched decode, the single cache alone)."""
    per = sequence_cache_bytes(info)
    if per > kv_cache_bytes:
        raise EdgerunError(f"one sequence's KV cache at context {info.context} takes {per >> 20} MB, over the "
                           f"KV-cache bound of {kv_cache_bytes >> 20} MB: raise the bound or lower the context")
    fit = kv_cache_bytes // per - 1
    return max(1, min(slots, fit if fit >= 2 else 1))


def stop_token_ids(info: ModelInfo, tokenizer: Tokenizer | None, render: Callable[..., str] = render_chat,
                   ) -> set[int]:
    """The checkpoint's eos (all of them when it lists several), end of turn (eot) and end of message (eom),
    and the token the chat template closes an assistant turn with: never a hard-coded token string.
    `render` renders the template (the server passes its bounded out-of-process renderer)."""
    ids = {i for role, i in info.special.items() if role.split("_")[0] in ("eos", "eot", "eom")}
    end = end_of_turn_id(info, tokenizer, render)
    return ids | ({end} if end is not None else set())


def end_of_turn_id(info: ModelInfo, tokenizer: Tokenizer | None, render: Callable[..., str] = render_chat,
                   ) -> int | None:
    """The added token the chat template writes right after an assistant message, if any."""
    if tokenizer is None or not info.chat_template:
        return None
    mark = "\u0000reply\u0000"
    try:
        text = render(info.chat_template, [{"role": "user", "content": "Hi"},
                                                {"role": "assistant", "content": mark}],
                           add_generation_prompt=False, special_tokens=template_tokens(info, tokenizer))
    except EdgerunError:
        return None
    ids = [i for i in tokenizer.encode(text.partition(mark)[2]) if i != tokenizer.bos_id]
    return ids[0] if ids and ids[0] in tokenizer.added_ids else None


def template_tokens(info: ModelInfo, tokenizer: Tokenizer) -> dict[str, str]:
    """The special tokens' text a chat template reads (`bos_token`, `eos_token`)."""
    return {f"{role}_token": tokenizer.tokens[info.special[role]] for role in ("bos", "eos") if role in info.special}


def model_info(checkpoint: Checkpoint, context: int | None, chunk: int) -> ModelInfo:
    limit = checkpoint.config.context
    context = min(limit, DEFAULT_CONTEXT) if context is None else int(context)
    if not 2 <= context <= limit:
        raise EdgerunError(f"context must be between 2 and the model's {limit} tokens, got {context}")
    if not 2 <= chunk <= context:
        raise EdgerunError(f"prefill chunk must be between 2 and the context ({context}), got {chunk}")
    name = os.path.basename(os.path.normpath(checkpoint.source))
    return ModelInfo(name, checkpoint.source, checkpoint.digest, checkpoint.config, context, chunk,
                     checkpoint.chat_template, dict(checkpoint.special))


def checkpoint_tokenizer(checkpoint: Checkpoint) -> Tokenizer | None:
    if checkpoint.tokenizer_metadata.get("tokenizer.ggml.tokens"):
        return tokenizer_from_gguf(checkpoint.tokenizer_metadata)
    if checkpoint.tokenizer_json:
        return tokenizer_from_json(checkpoint.tokenizer_json, checkpoint.special)
    return None


def step_weights(checkpoint: Checkpoint, dequantize: bool = False) -> dict[str, Weight]:
    """The checkpoint's weights as `step_graph` takes them: packed blocks as they are (float32 if
    `dequantize`), the projections transposed to [in, out], everything else float32."""
    weights: dict[str, Weight] = {}
    for n, w in checkpoint.weights.items():
        if isinstance(w, PackedWeight) and not dequantize:
            weights[n] = w
        elif n.rsplit(".", 1)[-1] in PROJECTIONS:
            # Dequantize straight into the [in, out] layout the projections use; no [out, in] copy is kept.
            weights[n + ".T"] = np.ascontiguousarray(checkpoint.float_weight(n).T)
        else:
            weights[n] = checkpoint.float_weight(n)
    return weights


def build_program(checkpoint: Checkpoint, info: ModelInfo, dequantize: bool = False,
                  int8_decode: bool = True, int8_prefill: bool = True, slots: int = 1) -> Program:
    """The model as one program: methods `prefill` (the default) and `decode`, one set of weight arrays
    (stored once in a file: the methods share constants by name) and the KV cache as zero-initialised
    states (their identical zero segments are stored once too).

    Q4_0/Q4_1/Q8_0 weights stay packed unless `dequantize` (then every weight is float32). `int8_decode`:
    the decode method's packed matmuls round their input to int8 per group (llama.cpp's Q8 activations;
    2.5x faster decoding on ONNX Runtime, logit error in docs/llm.md). `int8_prefill`: prefill's too. Then
    the two methods are one graph at two lengths, which ONNX Runtime runs as one session holding one packed
    copy of the weights (backends/onnxruntime/onnx_shape_variants.py: SmolLM2's peak RSS 479 -> 405 MB,
    and prefill no slower: 616-624 against 530-536 tokens/s, docs/llm.md); with float inputs prefill needs
    a session of its own.

    `slots` > 1: also `decode_batch` (one token for each of `slots` sequences, the decode method's weights and
    int8 setting) and `commit_slot`, with the slot caches as more state (program_builder.py).
    """
    weights = step_weights(checkpoint, dequantize)
    shared: dict[str, Any] = {}  # the packed operands, made once for both methods
    methods = {
        "prefill": step_graph(info.config, weights, chunk=info.chunk, context=info.context,
                              int8_activations=int8_decode and int8_prefill, shared=shared,
                              layout="heads"),
        "decode": step_graph(info.config, weights, chunk=1, context=info.context, int8_activations=int8_decode,
                             shared=shared, layout="heads"),
    }
    # Initial values as read-only zeros in one element's memory: the runtime's state buffers are the cache
    # (StateStore copies these into them), so a resident zero cache of the program's own would be a second
    # copy (22 MB at context 512).
    specs = cache_specs(info.config, info.context, "heads")
    if slots > 1:
        methods["decode_batch"] = batched_decode_graph(info.config, weights, slots=slots, context=info.context,
                                                       int8_activations=int8_decode, shared=shared)
        methods["commit_slot"] = slot_commit_graph(info.config, slots=slots, context=info.context)
        specs |= cache_specs(info.config, info.context, slots=slots)
    zero = np.zeros((), np.float32)
    state = {name: np.broadcast_to(zero, spec.shape) for name, spec in specs.items()}
    return Program.from_methods(methods, default_method="prefill", state=state,
                                metadata={**default_metadata(), "name": info.name, "source_digest": info.digest})


def load_program(source: Program, backends: Sequence[str] | str | None) -> LoadedProgram:
    """The program loaded, then the host's copy of the weights a backend keeps in its own packed form
    dropped (runtime/constant_release.py: ONNX Runtime's prepacked 4-bit codes, about 50 MB for SmolLM2).
    The model never saves the program it runs, so it can let those arrays go."""
    from edgerun.search import load  # edgerun.load: "auto" is resolved by the search, then the runtime loads

    loaded = load(source, backends=backends)
    if not isinstance(loaded, LoadedProgram):  # a template: the step builder fixes every shape
        raise EdgerunError("an LLM program has fixed shapes; this one has symbolic dimensions")
    release_constants(loaded)
    return loaded


def info_to_json(info: ModelInfo) -> dict[str, Any]:
    return {"name": info.name, "source": info.source, "digest": info.digest, "config": info.config.to_json(),
            "context": info.context, "chunk": info.chunk, "chat_template": info.chat_template,
            "special": info.special}


def info_from_json(data: dict[str, Any]) -> ModelInfo:
    return ModelInfo(data["name"], data["source"], data["digest"], Architecture.from_json(data["config"]),
                     int(data["context"]), int(data["chunk"]), data.get("chat_template"),
                     {k: int(v) for k, v in data.get("special", {}).items()})


