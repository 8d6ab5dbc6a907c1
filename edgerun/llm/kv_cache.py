"""The host side of the static-shape programs: a KV cache in numpy arrays, fed to the step programs.

`StepRunner.forward(ids)` appends tokens to the cache and returns the logits after the last one. Runs of two
or more tokens go through the prefill program in chunks of its length (the last chunk padded), single tokens
through the decode program; each call's new key/value rows are written into the cache here.

The cache is not copied into the decode program on every step: when the decode program's arena gives each
cache input bytes of its own (no other value is ever planned over them; checked on the plan, `_resident`),
the cache arrays *are* those input views, the new rows are written straight into them, and the runtime's
copy of an input onto itself is skipped. A prefill chunk still copies the cache into its own program (once
per chunk, not per token). When the plan shares the bytes, the cache is a separate array, copied per call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.llm.architecture import LlamaArchitecture
from edgerun.runtime import LoadedProgram


class StepRunner:
    def __init__(self, config: LlamaArchitecture, prefill: LoadedProgram, decode: LoadedProgram, *,
                 chunk: int, context: int) -> None:
        self.config, self.prefill, self.decode, self.chunk, self.context = config, prefill, decode, chunk, context
        kv, hd = config.kv_heads, config.head_dim
        names = [f"{kind}_cache_{i}" for i in range(config.layers) for kind in ("k", "v")]
        resident = _resident(decode, names)
        self.copies_cache = resident is None  # True: each decode step copies the cache into the program
        if resident is None:
            resident = {n: np.zeros(decode.input_specs[n].shape, np.float32) for n in names}
        for cache in resident.values():
            # Zeros, not whatever the arena held: masked slots get probability 0, and 0 * NaN would be NaN.
            cache.fill(0)
        self.k_cache = [resident[f"k_cache_{i}"] for i in range(config.layers)]
        self.v_cache = [resident[f"v_cache_{i}"] for i in range(config.layers)]
        assert all(c.shape == (kv, hd, context) for c in self.k_cache)
        self.tokens: list[int] = []  # what the cache holds, position by position

    @property
    def position(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        self.tokens = []

    def reuse_prefix(self, ids: Sequence[int]) -> list[int]:
        """Keep the cached prefix `ids` shares with what the cache holds; return the ids still to run.

        At least one id is always left to run: the caller needs the logits after the last one.
        """
        keep = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            keep += 1
        keep = min(keep, len(ids) - 1)
        self.tokens = self.tokens[:keep]
        return list(ids[keep:])

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        if not ids:
            raise EdgerunError("nothing to run: no token ids")
        if self.position + len(ids) > self.context:
            raise EdgerunError(f"{self.position + len(ids)} tokens do not fit the context of {self.context}")
        if len(ids) == 1:
            return self._run(self.decode, list(ids), 1)
        for begin in range(0, len(ids), self.chunk):
            logits = self._run(self.prefill, list(ids[begin:begin + self.chunk]), self.chunk)
        return logits

    def _run(self, program: LoadedProgram, ids: list[int], length: int) -> np.ndarray:
        n, start = len(ids), self.position
        tokens = np.zeros(length, np.int64)
        tokens[:n] = ids
        caches = [c for pair in zip(self.k_cache, self.v_cache) for c in pair]
        outs = program.run([tokens, np.array([start], np.int64), np.array([n - 1], np.int64), *caches])
        self._write_rows(outs[1:], start, n)
        self.tokens += ids
        return outs[0]

    def _write_rows(self, rows: list[np.ndarray], start: int, n: int) -> None:
        for i in range(self.config.layers):
            self.k_cache[i][:, :, start:start + n] = rows[2 * i][:, :, :n]
            self.v_cache[i][:, start:start + n, :] = rows[2 * i + 1][:, :n, :]


def _resident(program: LoadedProgram, names: list[str]) -> dict[str, np.ndarray] | None:
    """The arena views of inputs `names` when no other buffer of the plan ever overlaps their bytes."""
    plan, views = program.parts.plan, program.parts.views
    mine = {plan.buffer_of(n) for n in names}
    if any(n not in views or plan.buffer_of(n) not in plan.offsets for n in names):
        return None
    spans = {b: (plan.offsets[b], plan.offsets[b] + plan.buffers[b].nbytes) for b in plan.offsets}
    for b in mine:
        lo, hi = spans[b]
        if any(o != b and s < hi and lo < e for o, (s, e) in spans.items()):
            return None
    return {n: views[n] for n in names}
