"""Choosing the next token from logits: greedy, or sampled after repetition penalty, temperature, top-k,
top-p and min-p (applied in that order, as transformers' and llama.cpp's samplers do)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from edgerun.errors import EdgerunError


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    seed: int | None = None

    def check(self) -> None:
        def bad(name: str, value: object, rule: str) -> EdgerunError:
            return EdgerunError(f"{name} must be {rule}, got {value!r}")

        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) \
                or self.temperature < 0:
            raise bad("temperature", self.temperature, "a finite number >= 0")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise bad("top_k", self.top_k, "an integer >= 0")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise bad("top_p", self.top_p, "in (0, 1]")
        if not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p <= 1:
            raise bad("min_p", self.min_p, "in [0, 1]")
        if not isinstance(self.repetition_penalty, (int, float)) or not math.isfinite(self.repetition_penalty) \
                or self.repetition_penalty <= 0:
            raise bad("repetition_penalty", self.repetition_penalty, "a finite number > 0")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise bad("seed", self.seed, "an integer or None")


def penalize_repeats(logits: np.ndarray, history: Sequence[int], penalty: float) -> np.ndarray:
    """transformers' rule: a seen token's logit is divided by the penalty when positive, multiplied when not."""
    if penalty == 1.0 or not history:
        return logits
    logits = logits.copy()
    seen = np.unique(np.asarray(history, np.int64))
    values = logits[seen]
    logits[seen] = np.where(values > 0, values / penalty, values * penalty)
    return logits


def next_token(logits: np.ndarray, params: SamplingParams, history: Sequence[int], rng: np.random.Generator) -> int:
    logits = penalize_repeats(np.asarray(logits, np.float32), history, params.repetition_penalty)
    if params.temperature == 0:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / params.temperature
    order = np.argsort(-scaled, kind="stable")
    if params.top_k:
        order = order[:params.top_k]
    kept = scaled[order]
    probs = np.exp(kept - kept[0])
    probs /= probs.sum()
    if params.top_p < 1.0:
        # Keep the smallest head whose mass reaches top_p (at least one token).
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p) + 1)
        order, probs = order[:cut], probs[:cut]
    if params.min_p > 0:
        keep = probs >= params.min_p * probs[0]
        order, probs = order[keep], probs[keep]
    probs = probs / probs.sum()
    return int(order[rng.choice(len(order), p=probs)])
