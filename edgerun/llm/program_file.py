"""`edgerun llm export`: a model as one program file that loads without the GGUF.

    model.edgerun   methods `prefill` (default) and `decode`, the weights once (packed as in the GGUF),
                    the KV cache as zero-initialised state, and in the metadata under "llm" the
                    architecture, context, chunk, tokenizer (vocabulary, merges, specials) and chat template

`edgerun.llm.load(path)` runs the file like the GGUF. The folder written by earlier versions (prefill.edgerun,
decode.edgerun and llm.json, format "edgerun-llm-bundle") is refused with a message saying to re-export.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from edgerun.errors import EdgerunError
from edgerun.llm.checkpoint import load_checkpoint
from edgerun.llm.model import (
    DEFAULT_CHUNK,
    LanguageModel,
    build_program,
    checkpoint_tokenizer,
    info_from_json,
    info_to_json,
    load_program,
    model_info,
)
from edgerun.llm.tokenizer import Tokenizer
from edgerun.program import Program
from edgerun.program.format import MAGIC

LLM_FORMAT = "edgerun-llm-program"
LLM_VERSION = 2  # 2: the tokenizer as a `tokenizers` JSON
OLD_BUNDLE_MANIFEST = "llm.json"  # the manifest of the two-file bundle folders of earlier versions


def export_program(source: str | os.PathLike[str], output: str | os.PathLike[str], *, context: int | None = None,
                   chunk: int = DEFAULT_CHUNK, dequantize: bool = False) -> str:
    """Write the model's program file; returns its path."""
    checkpoint = load_checkpoint(source)
    info = model_info(checkpoint, context, chunk)
    output = os.fspath(output)
    if os.path.isdir(output):
        raise EdgerunError(f"{output!r} is a folder; `edgerun llm export` writes one program file")
    program = build_program(checkpoint, info, dequantize)
    program.metadata["llm"] = {"format": LLM_FORMAT, "version": LLM_VERSION, "model": info_to_json(info),
                               "tokenizer": _tokenizer_json(checkpoint_tokenizer(checkpoint))}
    program.save(output)
    return output


def is_program_file(path: str) -> bool:
    """True for an edgerun program file; an old bundle folder raises (it is no longer loaded)."""
    if os.path.isfile(os.path.join(path, OLD_BUNDLE_MANIFEST)):
        raise EdgerunError(f"{path!r} is an LLM bundle folder (format edgerun-llm-bundle: prefill.edgerun, "
                           f"decode.edgerun, llm.json) written by an earlier edgerun, which is no longer "
                           f"loaded; re-export the model as one program file: edgerun llm export MODEL.gguf -o "
                           f"model.edgerun")
    if not os.path.isfile(path):
        return False
    with open(path, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def load_program_file(path: str, backends: Sequence[str] | str | None = None, *, dequantize: bool = False,
                      context: int | None = None) -> LanguageModel:
    program = Program.read(path)
    llm = program.metadata.get("llm")
    if not isinstance(llm, dict) or llm.get("format") != LLM_FORMAT:
        raise EdgerunError(f"{path!r} is an edgerun program but not an LLM exported by `edgerun llm export` "
                           f"(no {LLM_FORMAT!r} metadata)")
    if llm.get("version") != LLM_VERSION:
        raise EdgerunError(f"{path!r} is an {LLM_FORMAT} of version {llm.get('version')!r}; this edgerun reads "
                           f"version {LLM_VERSION}: re-export it")
    info = info_from_json(llm["model"])
    if dequantize:
        raise EdgerunError(f"{path!r} runs the weights it was exported with; dequantize applies to a GGUF "
                           f"(export with --dequantize for float32 weights)")
    if context is not None and context != info.context:
        raise EdgerunError(f"{path!r} was exported with a context of {info.context} tokens (its KV-cache "
                           f"state), not {context}; re-export with --context {context}")
    missing = {"prefill", "decode"} - set(program.methods)
    if missing:
        raise EdgerunError(f"{path!r} lacks the LLM method(s) {sorted(missing)}")
    tok = llm.get("tokenizer")
    tokenizer = Tokenizer.from_json(tok) if tok else None
    return LanguageModel(info, tokenizer, load_program(program, backends))


def _tokenizer_json(tokenizer: Tokenizer | None) -> dict[str, Any] | None:
    return None if tokenizer is None else tokenizer.to_json()
