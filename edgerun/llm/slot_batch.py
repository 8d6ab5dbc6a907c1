"""Several sequences decoding together: the batched decode's cache slots, on the host side.

A program loaded with `slots=B` (model.py) has B cache slots besides the single-sequence cache. A sequence
joins the batch after its prompt ran through `prefill` into the single-sequence cache (StepRunner): `admit`
copies that cache into a free slot (`commit_slot`). From then on `step` decodes one token for each sequence
given, all in one call of `decode_batch`, each at its own position in its own slot. `release` frees a slot;
nothing is cleared: a slot's cells past its position are masked, and the next admit overwrites the slot.

A slot that does not step in a call still gets a row written (the method always runs B sequences): at its
own next cell, which is masked and is what its next step writes anyway, or at cell 0 of a free slot. So a
sequence may sit out steps without harm, as long as its cache is not full.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.runtime import LoadedProgram


class SlotBatch:
    def __init__(self, program: LoadedProgram, *, slots: int, context: int) -> None:
        self.decode, self.commit = program.method("decode_batch"), program.method("commit_slot")
        self.slots, self.context = slots, context
        self.positions: list[int | None] = [None] * slots  # per slot: tokens its cache holds; None: free

    def free_slots(self) -> list[int]:
        return [i for i, p in enumerate(self.positions) if p is None]

    def admit(self, slot: int, position: int) -> None:
        """Copy the single-sequence cache, holding `position` tokens, into free slot `slot`."""
        if self.positions[slot] is not None:
            raise EdgerunError(f"cache slot {slot} is in use")
        self.commit.run([np.array([slot], np.int64)])
        self.positions[slot] = position

    def release(self, slot: int) -> None:
        self.positions[slot] = None

    def step(self, tokens: Mapping[int, int]) -> dict[int, np.ndarray]:
        """Append token `tokens[slot]` to each slot given, in one call; the [vocab] logits after it, by slot."""
        ids, starts = np.zeros(self.slots, np.int64), np.zeros(self.slots, np.int64)
        for slot, position in enumerate(self.positions):
            if position is None:
                continue
            if position >= self.context:
                raise EdgerunError(f"cache slot {slot} is full ({self.context} tokens): release it first")
            starts[slot] = position
        for slot, token in tokens.items():
            if self.positions[slot] is None:
                raise EdgerunError(f"cache slot {slot} holds no sequence")
            ids[slot] = token
        logits = self.decode.run([ids, starts])[0]
        out = {}
        for slot in tokens:
            out[slot] = np.array(logits[slot])
            self.positions[slot] = int(starts[slot]) + 1
        return out
