"""`/v1/embeddings` from an encoder program: text -> the tokenizer's ids -> the program -> one vector each.

Any program whose inputs are named `input_ids` and, optionally, `attention_mask` and `token_type_ids`
([batch, sequence] integers) and whose first output is [batch, dim] (a pooled embedding, as all-MiniLM-L6-v2's
export from edgerun.zoo.minilm) or [batch, sequence, dim] (then mean-pooled over the attention mask). The
tokenizer is a Hugging Face `tokenizer.json`, read by the `tokenizers` library (the reference implementation
of those files), padded to the program's sequence length. An input longer than that is refused, not cut.

Batches: a program with a fixed batch size B runs B inputs a call (the last call padded with copies of its
last input, whose rows are dropped); one with a symbolic batch runs a request's inputs in one call.
"""

from __future__ import annotations

import base64
import os
import threading
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.symbolic import SymDim

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class Embedder:
    def __init__(self, program: Any, tokenizer_json: str, name: str) -> None:
        from tokenizers import Tokenizer

        self.program, self.name = program, name
        specs = program.input_specs
        unknown = [n for n in specs if n not in INPUTS]
        if "input_ids" not in specs or unknown:
            raise EdgerunError(f"an embedding program takes inputs named {', '.join(INPUTS)} (input_ids at "
                               f"least); this one takes {', '.join(specs)}")
        shape = specs["input_ids"].shape
        if len(shape) != 2 or isinstance(shape[1], SymDim):
            raise EdgerunError(f"the embedding program's input_ids must be [batch, sequence] with a fixed "
                               f"sequence length, got {shape}")
        self.inputs = list(specs)
        self.batch: int | None = None if isinstance(shape[0], SymDim) else int(shape[0])
        self.length = int(shape[1])
        self.dtypes = {n: specs[n].dtype.np for n in self.inputs}
        try:
            self.tokenizer = Tokenizer.from_file(tokenizer_json)
        except Exception as exc:
            raise EdgerunError(f"cannot read the tokenizer {tokenizer_json}: {exc}") from None
        self.tokenizer.no_truncation()
        self.tokenizer.enable_padding(length=self.length)
        self._lock = threading.Lock()  # one run of the program at a time

    @classmethod
    def load(cls, program_path: str, tokenizer_json: str, name: str | None = None) -> Embedder:
        import edgerun

        return cls(edgerun.load(program_path), tokenizer_json,
                   name or os.path.splitext(os.path.basename(program_path))[0])

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        """[len(texts), dim] float32 vectors and the number of tokens they took (blocking)."""
        encodings = self.tokenizer.encode_batch(texts)
        for i, e in enumerate(encodings):
            if len(e.ids) > self.length:  # padding stops at the length; a longer input is left as it is
                raise EdgerunError(f"input {i} has {len(e.ids)} tokens; the embedding program takes at most "
                                   f"{self.length}")
        arrays = {"input_ids": np.array([e.ids for e in encodings]),
                  "attention_mask": np.array([e.attention_mask for e in encodings]),
                  "token_type_ids": np.array([e.type_ids for e in encodings])}
        step = self.batch or len(texts)
        out = []
        with self._lock:
            for begin in range(0, len(texts), step):
                rows = {n: a[begin:begin + step] for n, a in arrays.items()}
                real = len(rows["input_ids"])
                if real < step:  # a fixed batch: pad with copies of the last input, dropped below
                    rows = {n: np.concatenate([a, np.repeat(a[-1:], step - real, 0)]) for n, a in rows.items()}
                result = self.program.run([rows[n].astype(self.dtypes[n]) for n in self.inputs])[0]
                if result.ndim == 3:  # token states: mean over the real tokens
                    mask = rows["attention_mask"][..., None].astype(np.float32)
                    result = (result * mask).sum(1) / np.maximum(mask.sum(1), 1e-9)
                out.append(np.asarray(result, np.float32)[:real])
        return np.concatenate(out), int(arrays["attention_mask"].sum())


def encode_vector(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """OpenAI's two forms: a list of floats, or base64 of the little-endian float32 bytes (the openai client
    asks for this one by default and decodes it)."""
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(vector, "<f4").tobytes()).decode()
    return [float(x) for x in vector]
