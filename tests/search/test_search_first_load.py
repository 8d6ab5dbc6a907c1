"""The first auto load's measurements (edgerun.search.tune, timing): every decision of the search checked
exactly, on a fake clock that fake engines advance as they are built and called."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from search_testkit import FakeClock, FakeEngines, FakeTrial, chain, modelled_table

from edgerun.oracle import interpret
from edgerun.runtime import load as runtime_load
from edgerun.runtime.instructions import EventSink, InstructionEvent
from edgerun.search import CACHE_ENV, search_placement
from edgerun.search.placement_search import SearchResult
from edgerun.search.timing import WARM_UP_CALLS, WARM_UP_S, warm_up_seconds
from edgerun.search.tune import (
    LEAVE_OUT,
    MARGINS,
    Candidate,
    FirstPass,
    cached_placement,
    cheap_single,
    measuring_order,
    safety_net,
    tune_placement,
)

ORT, REF, MNN = "onnxruntime", "reference", "mnn"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    return tmp_path


def by_label(report: dict) -> dict:  # type: ignore[type-arg]
    return {c["label"]: c for c in report["candidates"]}


def test_warm_up_sees_past_a_slow_first_call() -> None:
    clock = FakeClock()
    fresh = FakeTrial(clock, lambda n: 0.008 if n == 1 else 0.0005)  # a fresh session: 8 ms, then 0.5
    assert warm_up_seconds(lambda sink: fresh.run(None, sink), clock=clock) == pytest.approx(0.0005, rel=1e-12)
    assert fresh.calls == WARM_UP_CALLS


def test_warm_up_calls_a_slow_model_once() -> None:
    clock = FakeClock()
    slow = FakeTrial(clock, lambda n: WARM_UP_S * 1.2)
    assert warm_up_seconds(lambda sink: slow.run(None, sink), clock=clock) == pytest.approx(WARM_UP_S * 1.2, rel=1e-12) and slow.calls == 1


def test_a_warm_up_past_its_limit_is_abandoned_at_the_next_instruction_boundary() -> None:
    clock = FakeClock()
    trial = FakeTrial(clock, lambda n: 0.04, instructions=4)  # 10 ms per instruction
    assert warm_up_seconds(lambda sink: trial.run(None, sink), limit_s=0.025, clock=clock) == math.inf
    assert clock.now == pytest.approx(0.03)  # three instructions ran: the third crossed 25 ms


def test_the_runtime_stops_a_call_whose_sink_raises_and_still_runs_after() -> None:
    g = chain(40)
    loaded = runtime_load(g, ["reference"])
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    executed: list[InstructionEvent] = []

    def run(sink: EventSink | None) -> None:
        def counting(event: InstructionEvent) -> None:
            executed.append(event)
            if sink is not None:
                sink(event)
        loaded.run([x], counting)

    ticks = iter(range(10**6))
    assert warm_up_seconds(run, limit_s=0.5, calls=1, clock=lambda: float(next(ticks))) == math.inf
    assert len(executed) == 1  # one clock tick per reading: the first boundary is past the limit
    np.testing.assert_allclose(loaded(x), interpret(g, [x])[0], rtol=1e-5)  # lock released, arena fine


def _tune(table_s: dict[str, float], engines: FakeEngines, key: str, optimum: list[str] | None = None,
          **kwargs: object) -> tuple[dict[str, str], dict, object]:  # type: ignore[type-arg]
    g = chain()
    table = modelled_table(g, table_s)
    best = search_placement(table) if optimum is None else \
        SearchResult(optimum, sum(table_s[b] for b in optimum), switches=len(set(optimum)))
    return tune_placement(g, table, best, key, loader=engines, clock=engines.clock, **kwargs)  # type: ignore[arg-type]


def test_a_bounded_first_load_abandons_a_candidate_whose_warm_up_already_lost() -> None:
    clock = FakeClock()
    engines = FakeEngines(clock, {ORT: 1e-4, REF: 2e-3}, instructions=6)  # the reference 20x slower
    # Modelled close (1.1x), so the reference is loaded; its warm-up is cut at 3x ORT's 0.6 ms.
    placement, report, loaded = _tune({ORT: 1.0, REF: 1.1}, engines, "abandon", budget_s=2.0,
                                      margins=replace(MARGINS, abandon_floor_s=0.0))
    assert by_label(report)["all reference"]["skipped"] == "warm-up call abandoned after 1.8 ms"
    assert report["complete"] and set(placement.values()) == {ORT} and loaded is not None
    assert cached_placement(chain(), "abandon") == placement


@pytest.mark.parametrize("reference_s", [2e-3, 1.5e-4, 5e-5])  # abandoned, measured and lost, measured and won
def test_every_candidate_but_the_winner_is_released_before_the_search_returns(reference_s: float) -> None:
    """Candidates that lose hold no memory past the search (the abandoned, those culled after their warm-up,
    and the contenders that lost the steady rounds): each is released once, and the winner handed back is not."""
    engines = FakeEngines(FakeClock(), {ORT: 1e-4, REF: reference_s}, instructions=6)
    placement, report, loaded = _tune({ORT: 1.0, REF: 1.1}, engines, f"release-{reference_s}", budget_s=2.0,
                                      margins=replace(MARGINS, abandon_floor_s=0.0))
    assert len(engines.trials) == 2 and loaded in engines.trials
    assert [t.released for t in engines.trials] == [t is not loaded for t in engines.trials]
    assert set(placement.values()) == ({REF} if reference_s < 1e-4 else {ORT})
    assert ("skipped" in by_label(report)["all reference"]) == (reference_s == 2e-3)  # abandoned, or measured


@pytest.mark.parametrize("floor_s", [MARGINS.abandon_floor_s, 0.0])
def test_a_fresh_sessions_slow_first_call_is_not_abandoned_below_the_floor(floor_s: float) -> None:
    clock = FakeClock()
    # The reference is the optimum and warms up at 0.6 ms a call; ORT's fresh session takes 8 ms for its
    # first call, then 0.06 ms.
    engines = FakeEngines(clock, {ORT: 1e-5, REF: 1e-4}, first_call_s={ORT: 8e-3})
    placement, report, _ = _tune({ORT: 1.0, REF: 0.9}, engines, f"fresh-{floor_s}", budget_s=2.0,
                                 margins=replace(MARGINS, abandon_floor_s=floor_s))
    ort = by_label(report)["all onnxruntime"]
    if floor_s:
        assert ort["measured_s"] == pytest.approx(6e-5) and set(placement.values()) == {ORT}
    else:  # no floor: 8 ms is past 3x the reference's 0.6 ms, and ORT is lost
        assert ort["skipped"] == "warm-up call abandoned after 1.8 ms" and set(placement.values()) == {REF}


@pytest.mark.parametrize("build_margin", [MARGINS.build_margin, 1.0])
def test_a_build_counts_its_margin_times_its_estimate_against_the_budget(build_margin: float) -> None:
    clock = FakeClock()
    engines = FakeEngines(clock, {ORT: 1e-4, REF: 1e-4})

    def estimate(placement: dict[str, str]) -> float:  # the reference's build fits the budget once, not twice
        return 0.6 if set(placement.values()) == {REF} else 0.0

    _, report, _ = _tune({ORT: 1.0, REF: 1.1}, engines, f"margin-{build_margin}", budget_s=1.0,
                         build_estimate=estimate, margins=replace(MARGINS, build_margin=build_margin))
    reference = by_label(report)["all reference"]
    if build_margin > 1.0 / 0.6:
        assert reference["skipped"] == "its build would overrun the budget"
    else:
        assert reference["measured_s"] is not None
    assert report["complete"]


def test_a_candidate_modelled_beyond_the_cutoff_is_never_loaded_and_the_winner_is_still_cached() -> None:
    clock = FakeClock()
    engines = FakeEngines(clock, {ORT: 1e-4, REF: 1e-4})
    placement, report, loaded = _tune({ORT: 1.0, REF: 10 * MARGINS.modelled_cutoff}, engines, "cutoff")
    assert [c["label"] for c in report["candidates"] if c.get("skipped")] == ["all reference"]
    assert by_label(report)["all reference"]["skipped"] == "modelled beyond the cutoff"
    assert engines.loaded == [(ORT,)] and report["complete"] and report["winner"] == "search"
    assert cached_placement(chain(), "cutoff") == placement and loaded is not None


def test_a_spent_budget_leaves_out_single_engines_the_model_ranks_slower() -> None:
    engines = FakeEngines(FakeClock(), {ORT: 1e-4, REF: 1e-4})
    _, rushed, _ = _tune({ORT: 1.0, REF: 1.1}, engines, "rushed", budget_s=1e-9)
    assert by_label(rushed)["all reference"]["skipped"] == "budget spent, modelled slower than the optimum"
    assert rushed["complete"]
    engines = FakeEngines(FakeClock(), {ORT: 1e-4, REF: 1e-4})
    _, unbounded, _ = _tune({ORT: 1.0, REF: 1.1}, engines, "unbounded")
    assert all(c["measured_s"] is not None for c in unbounded["candidates"])


@pytest.mark.parametrize("over_optimum", [1.1, 1.6, 2.5])
def test_under_an_optimum_on_one_engine_another_is_measured_only_when_modelled_close(over_optimum: float) -> None:
    clock = FakeClock()
    engines = FakeEngines(clock, {ORT: 1e-5, REF: 1e-4})  # ORT is in fact 10x faster
    placement, report, _ = _tune({REF: 1.0, ORT: over_optimum}, engines, f"close-{over_optimum}", budget_s=2.0,
                                 build_estimate=lambda placement: 0.0)
    ort = by_label(report)["all onnxruntime"]
    if over_optimum <= MARGINS.cheap_single_slack:  # within the slack, or within 2x while the budget lasts
        assert ort["measured_s"] == pytest.approx(6e-5) and set(placement.values()) == {ORT}
    else:
        assert ort["skipped"] == "the optimum is one engine; modelled slower than it"
        assert set(placement.values()) == {REF}


@pytest.mark.parametrize("mnn_build_s", [0.3, 5.0])  # a conversion that fits the budget, and one that does not
def test_the_cheapest_close_engine_is_built_first_and_the_faster_wins(mnn_build_s: float) -> None:
    clock = FakeClock()
    engines = FakeEngines(clock, {ORT: 1e-3, MNN: 1.5e-3, REF: 5e-2},
                          build_s={MNN: mnn_build_s, ORT: 0.1, REF: 0.001})
    builds = engines.build_s

    def estimate(placement: dict[str, str]) -> float:
        return sum(builds[b] for b in set(placement.values()))

    # MNN alone is the optimum; ORT modelled 1.8x behind (outside single_slack, within cheap_single_slack).
    placement, report, loaded = _tune({ORT: 1.0, MNN: 0.55, REF: 50.0}, engines, f"mnn-{mnn_build_s}",
                                      budget_s=1.0, build_estimate=estimate)
    assert engines.loaded == [(ORT,), (MNN,)]  # ORT's cheap build before MNN's conversion; the reference never
    assert by_label(report)["all reference"]["skipped"] == "modelled beyond the cutoff"
    assert report["winner"] == "all onnxruntime" and set(placement.values()) == {ORT}
    assert [c["label"] for c in report["candidates"] if c["measured_s"]] == ["all onnxruntime", "search"]
    assert report["complete"] and loaded is not None


def test_a_net_under_a_mixed_optimum_that_measures_far_slower_than_modelled_hands_over() -> None:
    clock = FakeClock()
    engines = FakeEngines(clock, {ORT: 1e-3, REF: 4e-3}, build_s={ORT: 0.5})
    # A mixed optimum; the reference alone modelled next to ORT, so (cheapest to build) it is the net; it
    # measures 3.8x its model, and ORT becomes the net, built although its build spends the whole budget.
    placement, report, loaded = _tune({ORT: 1e-3, REF: 1.05e-3}, engines, "net-handover",
                                      optimum=[ORT] * 3 + [REF] * 3, budget_s=0.5,
                                      build_estimate=lambda p: 0.0 if set(p.values()) == {REF} else 0.5)
    assert engines.loaded == [(REF,), (ORT, REF), (ORT,)]
    assert report["winner"] == "all onnxruntime" and set(placement.values()) == {ORT}
    assert report["complete"] and loaded is not None


def test_a_single_engine_optimum_that_measures_far_slower_than_modelled_hands_over_too() -> None:
    clock = FakeClock()
    engines = FakeEngines(clock, {ORT: 1e-3, REF: 4e-3}, build_s={ORT: 0.5})
    ratio = 1.5 * MARGINS.single_slack  # ORT modelled this far behind: outside single_slack
    placement, report, _ = _tune({ORT: 1e-3, REF: 1e-3 / ratio}, engines, "single-handover", budget_s=0.5,
                                 build_estimate=lambda p: 0.0 if set(p.values()) == {REF} else 0.5)
    assert engines.loaded == [(REF,), (ORT,)]
    assert report["winner"] == "all onnxruntime" and set(placement.values()) == {ORT}


def test_a_mix_must_win_by_the_mixed_margin_per_extra_backend() -> None:
    for mix_s, winner in ((0.97, "all onnxruntime"), (0.9, "search")):
        clock = FakeClock()
        engines = FakeEngines(clock, {ORT: 1.0 / 6, REF: 2.0 / 6}, call_s={(ORT, REF): mix_s})
        _, report, _ = _tune({ORT: 1.0, REF: 1.0}, engines, f"mixed-{mix_s}", optimum=[ORT] * 3 + [REF] * 3)
        assert by_label(report)["search"]["measured_s"] == pytest.approx(mix_s)
        assert report["winner"] == winner


def _candidates(*modelled: tuple[str, dict[str, str], float]) -> list[Candidate]:
    return [Candidate(*c) for c in modelled]


def test_under_a_mixed_optimum_the_safety_net_is_the_cheapest_build_among_close_single_engines() -> None:
    candidates = _candidates(("search", {"a": MNN, "b": REF}, 0.0207), ("all mnn", {"a": MNN, "b": MNN}, 0.0213),
                             ("all onnxruntime", {"a": ORT, "b": ORT}, 0.0217),
                             ("all reference", {"a": REF, "b": REF}, 0.0213 * MARGINS.single_slack * 1.01))
    assert safety_net(candidates, [0.0, 4.0, 0.3, 0.01]) == 2  # ORT: as close as MNN, a tenth of its build
    assert safety_net(candidates, None) == 1  # no build figures: the best-modelled
    assert safety_net(candidates, [0.0, 4.0, 5.0, 0.01]) == 1  # the reference builds cheapest but is too far


def test_the_cheap_single_engine_is_built_first_then_the_optimum_then_the_rest_cheapest_first() -> None:
    candidates = _candidates(("search", {"a": MNN, "b": ORT}, 0.026), ("all mnn", {"a": MNN, "b": MNN}, 0.028),
                             ("all onnxruntime", {"a": ORT, "b": ORT}, 0.041),
                             ("all reference", {"a": REF, "b": REF}, 2.8),
                             ("search, fewer partitions", {"a": MNN, "b": MNN}, 0.027))
    builds = [0.8, 0.85, 0.6, 0.001, 0.9]

    def first_pass(budget_s: float) -> FirstPass:
        return FirstPass(candidates, builds, MARGINS, FakeClock(), budget_s, budget_s, True)

    assert cheap_single(first_pass(2.0)) == 2  # the reference builds cheaper but is modelled 100x behind
    assert measuring_order(builds, 2) == [2, 0, 3, 1, 4]
    assert measuring_order(builds, None) == [0, 3, 2, 1, 4]
    assert cheap_single(first_pass(0.5)) is None  # its build alone would not fit the budget
    candidates[2] = candidates[2]._replace(modelled_s=0.026 * MARGINS.cheap_single_slack * 1.01)
    assert cheap_single(first_pass(2.0)) == 1  # ORT modelled too far behind: MNN alone is the cheapest


def test_the_rules_are_a_table_each_with_the_reason_it_reports() -> None:
    reasons = [rule.reason for rule in LEAVE_OUT]
    assert len(set(reasons)) == len(reasons) == 5
    assert [rule.reason for rule in LEAVE_OUT if rule.spares_net] == ["its build would overrun the budget"]
