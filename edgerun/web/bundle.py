"""`edgerun web export MODEL -o DIR`: the static bundle the browser runtime runs.

    DIR/
        index.html       the chat page
        runtime.js       plan replay with the browser's WebGPU, and the BPE tokenizer (no framework, no build)
        plan.json        the decode step's dispatch plan (decode_plan.py), shaders inline, with the prefill
                         step's (a chunk of prompt tokens per replay) inside
        weights.bin      the constants blob the plan binds (packed int4 projections as the GGUF stores them)
        model.json       tokenizer (vocabulary, merges, specials, split pattern), chat template pieces, stop ids

The page encodes the prompt, runs it through the prefill step a chunk at a time (the cache fills as it
goes; a one-token prompt takes the decode step), copies the cache into the decode plan's arena, then
decodes greedily with the GPU argmax; only a 4-byte token id crosses back per step.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from typing import Any

from edgerun.errors import EdgerunError
from edgerun.llm.chat_template import render_chat
from edgerun.llm.checkpoint import load_checkpoint
from edgerun.llm.model import ModelInfo, checkpoint_tokenizer, model_info, stop_token_ids, template_tokens
from edgerun.llm.tokenizer import GPT2_PATTERN, Tokenizer
from edgerun.web.decode_plan import build_plan, decode_program, with_prefill

STATIC = os.path.dirname(__file__)  # index.html and runtime.js ship as package data
STATIC_FILES = ("index.html", "runtime.js")
DEFAULT_CONTEXT = 256
# Prompt tokens per prefill replay: a prompt of L tokens is ceil(L / 16) replays; a chunk costs 16 decode
# steps' arithmetic however few of its rows are real, so a short chunk keeps short prompts cheap.
DEFAULT_CHUNK = 16
# Browsers bind storage ranges at multiples of 256 bytes (WebGPU's default minStorageBufferOffsetAlignment).
BROWSER_ALIGN = 256
_MARK = "\u0000message\u0000"


def export_web(model: str | os.PathLike[str], output: str | os.PathLike[str], *, context: int = DEFAULT_CONTEXT,
               int4: bool = True, chunk: int = DEFAULT_CHUNK) -> list[str]:
    """Write the bundle for a GGUF file or a Hugging Face folder; returns the paths written."""
    started = time.perf_counter()
    checkpoint = load_checkpoint(model)
    info = model_info(checkpoint, context, 2)  # chunk 2: the prefill program is built and dropped
    tokenizer = checkpoint_tokenizer(checkpoint)
    if tokenizer is None:
        raise EdgerunError(f"{os.fspath(model)!r} has no tokenizer; the chat page needs one")
    if tokenizer.kind != "byte_level" or tokenizer.split_pattern != GPT2_PATTERN:
        raise EdgerunError("the browser tokenizer is byte-level BPE with GPT-2's split pattern only; this model's "
                           f"is {tokenizer.kind} with {tokenizer.split_pattern!r}")
    if not 2 <= chunk <= info.context:  # a chunk of 1 is the decode step, which a one-token prompt takes
        raise EdgerunError(f"prefill chunk {chunk} is outside 2..{info.context} (the context)")
    decode = build_plan(decode_program(checkpoint, info, int4=int4), info.config, info.context,
                        align=BROWSER_ALIGN)
    prefill = build_plan(decode_program(checkpoint, info, int4=int4, chunk=chunk), info.config, info.context,
                         align=BROWSER_ALIGN, shared=decode)
    built = with_prefill(decode, prefill, chunk)
    output = os.fspath(output)
    if os.path.exists(output) and not os.path.isdir(output):
        raise EdgerunError(f"{output!r} exists and is not a folder")
    os.makedirs(output, exist_ok=True)
    written = []
    for name in STATIC_FILES:
        written.append(shutil.copyfile(os.path.join(STATIC, name), os.path.join(output, name)))
    plan = {**built.plan, "export_seconds": round(time.perf_counter() - started, 1)}
    written.append(_write_json(os.path.join(output, "plan.json"), plan))
    path = os.path.join(output, "weights.bin")
    built.weights.tofile(path)
    written.append(path)
    model_json = {"name": info.name, "digest": info.digest, "vocab": info.config.vocab, "context": info.context,
                  "layers": info.config.layers, "tokenizer": tokenizer_json(tokenizer),
                  "chat": chat_pieces(info, tokenizer),
                  "stop_ids": sorted(stop_token_ids(info, tokenizer))}
    written.append(_write_json(os.path.join(output, "model.json"), model_json))
    return written


def tokenizer_json(tokenizer: Tokenizer) -> dict[str, Any]:
    return {"tokens": tokenizer.tokens, "merges": tokenizer.bpe_merges(), "special_ids": tokenizer.special_ids,
            "bos_id": tokenizer.bos_id, "add_bos": tokenizer.add_bos}


def chat_pieces(info: ModelInfo, tokenizer: Tokenizer) -> dict[str, str] | None:
    """The chat template around one user message, as the text before and after it (the page has no Jinja)."""
    if not info.chat_template:
        return None
    text = render_chat(info.chat_template, [{"role": "user", "content": _MARK}], add_generation_prompt=True,
                       special_tokens=template_tokens(info, tokenizer))
    if text.count(_MARK) != 1:
        raise EdgerunError("the chat template does not place the message once; cannot split it for the page")
    before, after = text.split(_MARK)
    return {"before": before, "after": after}


def _write_json(path: str, data: Any) -> str:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f)
    return path
