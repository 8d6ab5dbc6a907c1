"""`edgerun llm export`: a model as a folder of program files that loads without the GGUF.

    model.edgerun/
        prefill.edgerun   the step program at the prefill chunk length
        decode.edgerun    the step program at one token
        llm.json          architecture, context, tokenizer (vocabulary, merges, specials), chat template

The weights are the GGUF's, packed (matmul_int4), and each of the two files carries them: one multi-method
file sharing weights and a KV-cache state waits on an IR op that writes rows at a run-time position
(docs/llm.md says why). `edgerun.llm.load(folder)` runs the bundle like the GGUF.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from edgerun.errors import EdgerunError
from edgerun.llm.checkpoint import load_checkpoint
from edgerun.llm.model import (
    BUNDLE_MANIFEST,
    DEFAULT_CHUNK,
    LanguageModel,
    build_programs,
    info_from_json,
    info_to_json,
    load_program,
    model_info,
)
from edgerun.llm.tokenizer import BPETokenizer
from edgerun.program import Program
from edgerun.program.program import default_metadata

BUNDLE_VERSION = 1


def export_bundle(source: str | os.PathLike[str], output: str | os.PathLike[str], *, context: int | None = None,
                  chunk: int = DEFAULT_CHUNK) -> list[str]:
    """Write the bundle folder; returns the paths written."""
    checkpoint = load_checkpoint(source)
    info = model_info(checkpoint, context, chunk)
    from edgerun.llm.model import checkpoint_tokenizer

    tokenizer = checkpoint_tokenizer(checkpoint)
    output = os.fspath(output)
    if os.path.exists(output) and not os.path.isdir(output):
        raise EdgerunError(f"{output!r} exists and is not a folder")
    os.makedirs(output, exist_ok=True)
    written = []
    for method, graph in zip(("prefill", "decode"), build_programs(checkpoint, info)):
        path = os.path.join(output, f"{method}.edgerun")
        Program(graph, {**default_metadata(), "name": f"{info.name}:{method}", "llm_method": method,
                        "source_digest": info.digest}).save(path)
        written.append(path)
    manifest = {"format": "edgerun-llm-bundle", "version": BUNDLE_VERSION, "model": info_to_json(info),
                "tokenizer": _tokenizer_json(tokenizer)}
    path = os.path.join(output, BUNDLE_MANIFEST)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    written.append(path)
    return written


def load_bundle(folder: str, backends: Sequence[str] | str | None = None) -> LanguageModel:
    with open(os.path.join(folder, BUNDLE_MANIFEST), encoding="utf-8") as f:
        manifest = json.load(f)
    if manifest.get("format") != "edgerun-llm-bundle" or manifest.get("version") != BUNDLE_VERSION:
        raise EdgerunError(f"{folder!r} is not an edgerun LLM bundle of version {BUNDLE_VERSION}")
    info = info_from_json(manifest["model"])
    programs = [Program.read(os.path.join(folder, f"{m}.edgerun")) for m in ("prefill", "decode")]
    tok = manifest.get("tokenizer")
    tokenizer = BPETokenizer(tok["tokens"], tok["merges"], tok["special_ids"], pattern=tok["pattern"],
                             bos_id=tok["bos_id"], eos_id=tok["eos_id"], add_bos=tok["add_bos"]) if tok else None
    return LanguageModel(info, tokenizer, load_program(programs[0], backends), load_program(programs[1], backends))


def _tokenizer_json(tokenizer: BPETokenizer | None) -> dict[str, Any] | None:
    if tokenizer is None:
        return None
    merges = [f"{a} {b}" for (a, b), _ in sorted(tokenizer.ranks.items(), key=lambda kv: kv[1])]
    return {"tokens": tokenizer.tokens, "merges": merges, "special_ids": tokenizer.special_ids,
            "pattern": tokenizer.pattern, "bos_id": tokenizer.bos_id, "eos_id": tokenizer.eos_id,
            "add_bos": tokenizer.add_bos}
