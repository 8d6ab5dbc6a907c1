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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.runtime import LoadedProgram


class StepRunner:
    def __init__(self, program: LoadedProgram, *, chunk: int, context: int) -> None:
        self.program, self.chunk, self.context = program, chunk, context
        self.prefill, self.decode = program.method("prefill"), program.method("decode")
        self.tokens: list[int] = []  # what the cache holds, position by position

    @property
    def position(self) -> int:
        return len(self.tokens)

    def reset(self) -> None:
        """Forget the cached tokens: the next run starts at position 0 (stale slots are masked, never read)."""
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
        ids = list(ids)
        if len(ids) == 1:
            return self._run(self.decode, ids, 1)
        for begin in range(0, len(ids), self.chunk):
            logits = self._run(self.prefill, ids[begin:begin + self.chunk], self.chunk)
        return logits

    def _run(self, method: LoadedProgram, ids: list[int], length: int) -> np.ndarray:
        start = min(self.position, self.context - length)  # update_slice must not clamp: see the module doc
        ids = self.tokens[start:] + ids
        self.tokens = self.tokens[:start]
        tokens = np.zeros(length, np.int64)
        tokens[:len(ids)] = ids
        logits = method.run([tokens, np.array([start], np.int64), np.array([len(ids) - 1], np.int64)])[0]
        self.tokens += ids
        return logits
