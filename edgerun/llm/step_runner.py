"""The host side of an LLM program: which tokens its KV-cache state holds, and which method runs them.

`StepRunner.forward(ids)` appends tokens to the cache and returns the logits after the last one. Runs of two
or more tokens go through the `prefill` method in chunks of its static length (the last chunk padded), single
tokens through `decode`. The cache itself is program state (program_builder.py): both methods read it as
views of the state's buffers and write their new rows there with update_slice, in place, so nothing here
holds or copies cache arrays; the runner only keeps the token ids, to know the position and the prefix a
new prompt can reuse.

update_slice clamps its start so the rows fit (XLA's dynamic_update_slice): a padded chunk starting less
than a chunk from the end of the context would be written at the wrong rows. Such a chunk starts earlier
instead, at context - chunk, and runs again the cached tokens it then covers: they are recomputed from the
same prefix and overwrite their own rows.

A prompt's logits do not depend on what the cache held before (`run_prompt`): a row computed by `decode`
(one token, the int8 GEMV path) or by a chunk that began elsewhere differs in its last bits from the row a
fresh prompt's prefill chunk computes, and greedy decoding can then pick another token on a repeat of the
same request. So the runner remembers how many leading rows (`exact`) were written by prefill chunks
starting at multiples of the chunk length, as a fresh run of the same tokens writes them, and a prompt
reuses only whole chunks of those; it runs the rest through `prefill` even when one token is left. A
repeated prompt then recomputes at most its last partial chunk, and a chat's next turn its last prompt
chunk and the previous answer (decoded rows are never reused).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.runtime import LoadedProgram, RunnableProgram


class StepRunner:
    def __init__(self, program: LoadedProgram, *, chunk: int, context: int) -> None:
        self.program, self.chunk, self.context = program, chunk, context
        self.prefill, self.decode = program.method("prefill"), program.method("decode")
        self.tokens: list[int] = []  # what the cache holds, position by position
        self.exact = 0  # leading rows as a fresh prompt's aligned prefill chunks write them (module doc)

    @property
    def position(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        """Forget the cached tokens: the next run starts at position 0 (stale slots are masked, never read)."""
        self.tokens = []
        self.exact = 0

    def reuse_prefix(self, ids: Sequence[int]) -> list[int]:
        """Keep the whole chunks of the cache that hold `ids`' prefix as a fresh run would; return the ids
        still to run (at least one: the caller needs the logits after the last one)."""
        common = 0
        for a, b in zip(self.tokens, ids):
            if a != b:
                break
            common += 1
        keep = min(common, self.exact, len(ids) - 1) // self.chunk * self.chunk
        self.tokens = self.tokens[:keep]
        self.exact = keep
        return list(ids[keep:])

    def run_prompt(self, ids: Sequence[int]) -> np.ndarray:
        """The logits after the prompt `ids`, the same whatever the cache held (module doc): the reusable
        prefix kept, the rest run through `prefill` in chunks aligned as a fresh run's."""
        if not ids:
            raise EdgerunError("nothing to run: no token ids")
        return self._prefill(self.reuse_prefix(ids))

    def forward(self, ids: Sequence[int]) -> np.ndarray:
        if not ids:
            raise EdgerunError("nothing to run: no token ids")
        if self.position + len(ids) > self.context:
            raise EdgerunError(f"{self.position + len(ids)} tokens do not fit the context of {self.context}")
        ids = list(ids)
        if len(ids) == 1:
            return self._run(self.decode, ids, 1)
        return self._prefill(ids)

    def _prefill(self, ids: list[int]) -> np.ndarray:
        if self.position + len(ids) > self.context:
            raise EdgerunError(f"{self.position + len(ids)} tokens do not fit the context of {self.context}")
        for begin in range(0, len(ids), self.chunk):
            logits = self._run(self.prefill, ids[begin:begin + self.chunk], self.chunk)
        return logits

    def _run(self, method: RunnableProgram, ids: list[int], length: int) -> np.ndarray:
        start = min(self.position, self.context - length)  # update_slice must not clamp: see the module doc
        ids = self.tokens[start:] + ids
        self.tokens = self.tokens[:start]
        tokens = np.zeros(length, np.int64)
        tokens[:len(ids)] = ids
        logits = method.run([tokens, np.array([start], np.int64), np.array([len(ids) - 1], np.int64)])[0]
        self.tokens += ids
        aligned = method is self.prefill and start == self.exact and start % self.chunk == 0
        self.exact = start + len(ids) if aligned else min(self.exact, start)
        return logits
