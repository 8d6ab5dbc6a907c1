"""The sampler against the plain rule it must compute: a stable sort of every token by probability, then
top-k, top-p and min-p applied in turn (transformers' and llama.cpp's order). The sampler itself sorts only a
head of the vocabulary, so the cases cover a head that holds top_p of the mass and one that does not."""

from __future__ import annotations

import numpy as np
import pytest

from edgerun.llm.sampling import (
    DRAW_BLOCK,
    TOP_P_HEAD,
    SamplingParams,
    draw,
    filtered_distribution,
    next_token,
)

VOCAB = 49_152  # SmolLM2's


def _plain_rule(logits: np.ndarray, p: SamplingParams) -> dict[int, float]:
    scaled = logits.astype(np.float64) / p.temperature
    order = np.argsort(-scaled, kind="stable")
    if p.top_k:
        order = order[:p.top_k]
    probs = np.exp(scaled[order] - scaled[order[0]])
    probs /= probs.sum()
    if p.top_p < 1.0:
        cut = int(np.searchsorted(np.cumsum(probs), p.top_p) + 1)
        order, probs = order[:cut], probs[:cut]
    if p.min_p > 0:
        keep = probs >= p.min_p * probs[0]
        order, probs = order[keep], probs[keep]
    return dict(zip(order.tolist(), (probs / probs.sum()).tolist()))


def _logits(spread: float, seed: int = 0) -> np.ndarray:
    # An LLM-like head: a few likely tokens above a broad tail (spread scales how peaked it is).
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal(VOCAB) * spread
    logits[rng.choice(VOCAB, 8, replace=False)] += 4 * spread
    return logits.astype(np.float32)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.7),
    SamplingParams(temperature=1.0, top_k=40),
    SamplingParams(temperature=0.8, top_p=0.9),
    SamplingParams(temperature=1.2, top_k=50, top_p=0.95, min_p=0.01),
    SamplingParams(temperature=1.0, min_p=0.05),
    SamplingParams(temperature=1.0, top_k=3000, top_p=0.5),
    SamplingParams(temperature=5.0, top_p=0.9),  # flat: the sorted head falls short, all tokens are sorted
], ids=str)
@pytest.mark.parametrize("spread", [0.5, 3.0])
def test_the_filtered_distribution_is_the_plain_rules(params: SamplingParams, spread: float) -> None:
    logits = _logits(spread)
    ids, weights = filtered_distribution(logits, params)
    want = _plain_rule(logits, params)
    got = dict(zip(ids.tolist(), (weights / weights.sum()).tolist()))
    assert set(got) == set(want)
    keys = sorted(want)
    np.testing.assert_allclose([got[i] for i in keys], [want[i] for i in keys], rtol=1e-4, atol=1e-9)


def test_a_flat_distribution_needs_more_than_the_sorted_head() -> None:
    # The fallback above really runs: the top_p head of a flat distribution is longer than TOP_P_HEAD.
    ids, _ = filtered_distribution(_logits(0.5), SamplingParams(temperature=5.0, top_p=0.9))
    assert len(ids) > TOP_P_HEAD


def test_ties_keep_the_lower_token_id_first() -> None:
    logits = np.zeros(1000, np.float32)
    ids, _ = filtered_distribution(logits, SamplingParams(temperature=1.0, top_k=5))
    assert ids.tolist() == [0, 1, 2, 3, 4]


def test_draws_follow_the_distribution() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05], np.float32))
    rng = np.random.default_rng(0)
    draws = [next_token(logits, SamplingParams(temperature=1.0), [], rng) for _ in range(20_000)]
    freq = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.015)
    # Temperature sharpens: at 0.5 the probabilities go as p**2.
    draws = [next_token(logits, SamplingParams(temperature=0.5), [], rng) for _ in range(20_000)]
    want = np.array([0.5, 0.3, 0.15, 0.05]) ** 2
    np.testing.assert_allclose(np.bincount(draws, minlength=4) / len(draws), want / want.sum(), atol=0.015)


def test_the_blockwise_draw_is_the_inverse_cdf_and_never_picks_a_zero_weight() -> None:
    rng = np.random.default_rng(3)
    weights = rng.random(4 * DRAW_BLOCK + 123).astype(np.float32)  # several blocks and a partial last one
    weights[rng.random(weights.size) < 0.5] = 0  # underflowed tokens: exp of a far lower logit
    weights[DRAW_BLOCK:2 * DRAW_BLOCK] = 0  # a whole block of them
    weights[-200:] = 0  # and the tail, where a draw rounded up would land
    cumulative = np.cumsum(weights, dtype=np.float64)
    for u in [*rng.random(2000), 0.0, 1 - 1e-16]:
        want = min(int(np.searchsorted(cumulative, u * cumulative[-1], side="right")), weights.size - 1)
        if weights[want] == 0:  # the full cumulative sum rounded past its end
            want = int(np.flatnonzero(weights[:want + 1])[-1])
        got = draw(weights, u)
        assert got == want and weights[got] > 0, (u, got, want)
