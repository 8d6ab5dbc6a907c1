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


# A top-p cut first sorts only this many of the most likely tokens, then all of them when their mass falls
# short: a stable argsort of SmolLM2's 49,152 logits in float64 made a sampled token cost about 9 ms, half a
# 16 ms decode step (an AMD EPYC host; a timed loop of 100 next_token calls on random logits).
TOP_P_HEAD = 256


def next_token(logits: np.ndarray, params: SamplingParams, history: Sequence[int], rng: np.random.Generator) -> int:
    logits = penalize_repeats(np.asarray(logits, np.float32), history, params.repetition_penalty)
    if params.temperature == 0:
        return int(np.argmax(logits))
    ids, weights = filtered_distribution(logits, params)
    return int(ids[draw(weights, rng.random())])


# The draw sums blocks of this many weights, then runs a cumulative sum inside the one block it lands in: a
# float64 cumulative sum over all 49,152 took 0.55 ms, the block sums 0.04.
DRAW_BLOCK = 1024


def draw(weights: np.ndarray, u: float) -> int:
    """The index whose share of the cumulative weight holds `u` in [0, 1): an inverse-CDF draw.

    A zero weight is never drawn: the cumulative sum does not rise there, and a pick rounded past a block's
    end falls back to the block's last weighed token.
    """
    n = weights.size
    starts = np.arange(0, n, DRAW_BLOCK)
    blocks = np.cumsum(np.add.reduceat(weights, starts, dtype=np.float64))
    target = u * blocks[-1]
    b = min(int(np.searchsorted(blocks, target, side="right")), len(starts) - 1)
    block = weights[starts[b]:starts[b] + DRAW_BLOCK]
    inside = np.cumsum(block, dtype=np.float64)
    i = min(int(np.searchsorted(inside, target - (blocks[b - 1] if b else 0.0), side="right")), block.size - 1)
    if block[i] == 0:
        i = int(np.flatnonzero(block[:i + 1])[-1])
    return int(starts[b] + i)


def filtered_distribution(logits: np.ndarray, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """The tokens left after temperature, top-k, top-p and min-p, and their unnormalised probabilities
    (the most likely token weighs 1).

    Only what a filter needs in order is sorted: top-k partitions out its k, top-p sorts a head of the most
    likely tokens and all of them only when that head holds less than top_p of the mass, and min-p is a
    threshold relative to the most likely token, which needs no order at all.
    """
    logits = np.asarray(logits, np.float32)
    weights = np.exp((logits - logits.max()) * np.float32(1.0 / params.temperature))
    n = weights.size
    k = params.top_k if 0 < params.top_k < n else n
    ids = _most_likely(logits, k) if k < n else None
    if params.top_p < 1.0:
        mass = float(weights.sum(dtype=np.float64) if ids is None else weights[ids].sum(dtype=np.float64))
        for head in (min(TOP_P_HEAD, k), k):
            ranked = ids[:head] if ids is not None else _most_likely(logits, head)  # the top-k come sorted
            cumulative = np.cumsum(weights[ranked], dtype=np.float64)
            if cumulative[-1] >= params.top_p * mass:
                break
        # The smallest head whose share of the mass reaches top_p (at least one token).
        ids = ranked[:int(np.searchsorted(cumulative / mass, params.top_p)) + 1]
    kept = weights if ids is None else weights[ids]  # None: every token, in vocabulary order
    if params.min_p > 0:
        keep = np.flatnonzero(kept >= params.min_p)
        ids, kept = (keep if ids is None else ids[keep]), kept[keep]
    return (np.arange(n) if ids is None else ids), kept


def _most_likely(scores: np.ndarray, m: int) -> np.ndarray:
    """The indices of the m highest scores, highest first, ties in index order (a stable descending sort)."""
    if m >= scores.size:
        return np.argsort(-scores, kind="stable")
    # The m-th highest score, then every score above it and the lowest indices of those equal to it: a plain
    # argpartition keeps an arbitrary few of the tied tokens, where a stable sort keeps the first.
    threshold = -np.partition(-scores, m - 1)[m - 1]
    above = np.flatnonzero(scores > threshold)
    head = np.concatenate([above, np.flatnonzero(scores == threshold)[:m - above.size]])
    return head[np.lexsort((head, -scores[head]))]
