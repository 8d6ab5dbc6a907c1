"""The first auto load's measurements (edgerun.search.tune): warm-up calls that see past a fresh session's
slow first call, within a bounded time."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from search_testkit import small_conv_net

from edgerun.backends.registry import get_backend
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.runtime import load as runtime_load
from edgerun.runtime.instructions import EventSink, InstructionEvent
from edgerun.search import CACHE_ENV, BackendProfile, cost_table, search_placement
from edgerun.search.tune import BUILD_MARGIN, WARM_UP_CALLS, WARM_UP_S, tune_placement, warm_up_seconds


def test_warm_up_sees_past_a_slow_first_call() -> None:
    calls = [0]

    def fresh_session() -> None:  # DIN on a fresh ORT session: the first call 8 ms, then microseconds
        calls[0] += 1
        time.sleep(0.008 if calls[0] == 1 else 0.0005)

    got = warm_up_seconds(lambda sink: fresh_session(), within_s=1.0)  # a generous window: a busy box sleeps long
    assert got < 0.006
    assert calls[0] == WARM_UP_CALLS


def test_warm_up_calls_a_slow_model_once() -> None:
    calls = [0]

    def slow() -> None:
        calls[0] += 1
        time.sleep(WARM_UP_S * 1.2)

    assert warm_up_seconds(lambda sink: slow()) >= WARM_UP_S
    assert calls[0] == 1


def slow_chain(nodes: int = 40, size: int = 256) -> Graph:
    """`nodes` dependent 256x256 matmuls: a program whose every instruction takes a while on the reference."""
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", TensorSpec((size, size), DType.float32))
    w = b.const((np.eye(size) * 0.5 + 0.5 / size).astype(np.float32))
    for _ in range(nodes):
        v = b.emit("matmul", [v, w])
    g.outputs = [v]
    return g


def test_a_warm_up_past_its_limit_is_abandoned_between_instructions_and_the_program_still_runs() -> None:
    graph = slow_chain()
    loaded = runtime_load(graph, ["reference"])
    x = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    executed: list[InstructionEvent] = []

    def run(sink: EventSink | None) -> None:  # the sink warm_up_seconds hands in, counting what ran
        def counting(event: InstructionEvent) -> None:
            executed.append(event)
            if sink is not None:
                sink(event)
        loaded.run([x], counting)

    assert warm_up_seconds(run, calls=1) < math.inf and len(executed) == len(loaded.instructions) == 40
    executed.clear()
    assert warm_up_seconds(run, limit_s=1e-9) == math.inf
    assert len(executed) == 1  # stopped at the first instruction boundary past the limit
    np.testing.assert_allclose(loaded(x), interpret(graph, [x])[0], rtol=1e-4)  # lock released, arena fine


def _reference_modelled_at(g: Graph, factor: float) -> Any:
    """The cost table of `g` over ORT and the reference with the reference modelled at `factor` x ORT."""
    backends = {"onnxruntime": get_backend("onnxruntime"), "reference": get_backend("reference")}
    fixed = BackendProfile(5e10, 5e10, 1e9, 1e10, 1e-6, 0.0)
    table = cost_table(g, backends, {"onnxruntime": fixed, "reference": fixed})
    ref, ort = table.backends.index("reference"), table.backends.index("onnxruntime")
    table.seconds[:, ref] = table.seconds[:, ort] * factor
    return table


def test_a_bounded_first_load_abandons_a_candidate_whose_warm_up_already_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", TensorSpec((1, 8, 16, 16), DType.float32))
    for _ in range(4):  # ~20x slower on the reference than on ORT
        w = b.const(np.random.default_rng(1).standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1)
        v = b.emit("tanh", [b.emit("conv2d", [v, w], padding=[1, 1, 1, 1])])
    g.outputs = [v]
    table = _reference_modelled_at(g, 1.1)  # misjudged: modelled close, so it is loaded
    # No floor here: this reference call takes ~1 ms, under the 50 ms a first call is always granted.
    placement, report, loaded = tune_placement(g, table, search_placement(table), "abandon-test", budget_s=2.0,
                                               abandon_floor_s=0.0)
    reasons = {c["label"]: c.get("skipped", "") for c in report["candidates"]}
    assert "abandoned" in reasons["all reference"]
    assert report["complete"] and set(placement.values()) == {"onnxruntime"} and loaded is not None


def test_a_build_counts_twice_its_estimate_against_the_budget(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Calibration's build figures ran 2.6x low on ResNet-50's MNN conversion (1.6 s estimated, 4.0 s taken).
    assert BUILD_MARGIN * 0.6 > 1.0
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    backends = {"onnxruntime": get_backend("onnxruntime"), "reference": get_backend("reference")}
    g = slow_chain(nodes=3, size=16)
    fixed = BackendProfile(5e10, 5e10, 1e9, 1e10, 1e-6, 0.0)
    table = cost_table(g, backends, {"onnxruntime": fixed, "reference": fixed})
    ref, ort = table.backends.index("reference"), table.backends.index("onnxruntime")
    # Modelled no faster than ORT runs three 16x16 matmuls (tens of microseconds), so the optimum is not
    # misjudged and does not hand over to the reference, which would then be built whatever the budget says.
    table.seconds[:, ort] = 0.01
    table.seconds[:, ref] = table.seconds[:, ort] * 1.1  # within SINGLE_SLACK: measured, unless its build
    budget = 1.0

    def estimate(placement: dict[str, str]) -> float:  # the reference's build fits the budget once, not twice
        return 0.6 * budget if set(placement.values()) == {"reference"} else 0.0

    _, report, _ = tune_placement(g, table, search_placement(table), "margin-test", budget_s=budget,
                                  build_estimate=estimate)
    reasons = {c["label"]: c.get("skipped") for c in report["candidates"]}
    assert reasons["all reference"] == "its build would overrun the budget"


def test_a_fresh_sessions_slow_first_call_is_not_abandoned_against_a_fast_warm_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen in bench/peers.py, idle: DIN's reference warm-up (0.14 ms) set a 0.42 ms cut, ORT's fresh session
    # spent ~8 ms on its first call and was abandoned unmeasured, and DIN ran on the reference at 2.8x ORT.
    # (How slow a fresh session's first call is varies: this graph does not always reach the cut, so the
    # test guards the outcome; ABANDON_FLOOR_S is what makes it hold when it does.)
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", TensorSpec((1, 16), DType.float32))
    for k in range(40):  # DIN-sized: many tiny ops, where per-op overhead is all there is
        v = b.emit("tanh" if k % 2 else "sigmoid", [v])
    g.outputs = [v]
    table = _reference_modelled_at(g, 0.9)  # the reference is the optimum: warmed up first
    _, report, _ = tune_placement(g, table, search_placement(table), "fresh-first-call", budget_s=2.0)
    by_label = {c["label"]: c for c in report["candidates"]}
    assert by_label["all onnxruntime"]["measured_s"] is not None, by_label["all onnxruntime"]
    assert "abandoned" not in by_label["all onnxruntime"].get("skipped", "")


def test_under_a_mixed_optimum_the_safety_net_is_the_cheapest_build_among_close_single_engines() -> None:
    from edgerun.search.tune import SINGLE_SLACK, _safety_net

    candidates = [("search", {"a": "mnn", "b": "reference"}, 0.0207), ("all mnn", {"a": "mnn", "b": "mnn"}, 0.0213),
                  ("all onnxruntime", {"a": "onnxruntime", "b": "onnxruntime"}, 0.0217),
                  ("all reference", {"a": "reference", "b": "reference"}, 0.0213 * SINGLE_SLACK * 1.01)]
    builds = {"mnn": 4.0, "onnxruntime": 0.3, "reference": 0.01}

    def build(placement: dict[str, str]) -> float:
        return builds[next(iter(placement.values()))]

    assert _safety_net(candidates, build) == 2  # ORT: as close as MNN, a tenth of its build
    assert _safety_net(candidates, None) == 1  # no build figures: the best-modelled
    builds["onnxruntime"] = 5.0
    assert _safety_net(candidates, build) == 1  # the reference builds cheapest but is modelled too far behind


def _mnn_modelled_ahead(g: Graph, mnn_factor: float) -> Any:
    """The cost table of `g` over ORT, MNN and the reference: MNN modelled at `mnn_factor` x ORT, the
    reference far behind (fixed figures: nothing here depends on this machine's calibration)."""
    names = ("onnxruntime", "mnn", "reference")
    backends = {n: get_backend(n) for n in names}
    fixed = BackendProfile(5e10, 5e10, 1e9, 1e10, 1e-6, 0.0)
    table = cost_table(g, backends, {n: fixed for n in names})
    col = {n: table.backends.index(n) for n in names}
    ort = table.seconds[:, col["onnxruntime"]].copy()
    table.seconds[:, col["mnn"]] = ort * mnn_factor
    table.seconds[:, col["reference"]] = ort * 50.0
    return table


@pytest.mark.parametrize("mnn_build_s", [0.3, 5.0])  # a conversion that fits the budget, and one that does not
def test_a_cheap_engine_the_model_ranks_far_behind_is_still_measured_and_the_faster_wins(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mnn_build_s: float) -> None:
    # Seen under load 7: with MNN's memory rate corrected the model put ResNet-18 at 26 ms on MNN against 41 on ORT,
    # where at idle the two ran within 5%; ORT fell outside SINGLE_SLACK, or MNN's conversion spent the
    # budget first, and was never timed.
    pytest.importorskip("onnxruntime")
    pytest.importorskip("MNN")
    from edgerun.search.tune import CHEAP_SINGLE_SLACK, SINGLE_SLACK, candidate_placements

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    g = small_conv_net()
    table = _mnn_modelled_ahead(g, 0.8)
    best = search_placement(table)
    assert set(best.backend_of) == {"mnn"}  # the optimum: MNN alone (labelled "search")
    modelled = {lb: m for lb, _, m in candidate_placements(g, table, best)}
    # ORT modelled ~1.8x behind: outside SINGLE_SLACK, within CHEAP_SINGLE_SLACK
    assert SINGLE_SLACK < modelled["all onnxruntime"] / modelled["search"] < CHEAP_SINGLE_SLACK
    builds = {"mnn": mnn_build_s, "onnxruntime": 0.1, "reference": 0.001}

    def estimate(placement: dict[str, str]) -> float:
        return sum(builds[b] for b in set(placement.values()))

    placement, report, loaded = tune_placement(g, table, best, f"mnn-ahead-{mnn_build_s}", budget_s=1.0,
                                               build_estimate=estimate)
    by_label = {c["label"]: c for c in report["candidates"]}
    measured = {lb: c["measured_s"] for lb, c in by_label.items() if c["measured_s"] is not None}
    assert set(measured) == {"search", "all onnxruntime"}, by_label
    # ORT's session (the cheapest build within CHEAP_SINGLE_SLACK) is built and warmed up before MNN's
    # conversion: the report lists them in that order.
    assert list(measured) == ["all onnxruntime", "search"]
    assert report["winner"] == min(measured, key=lambda lb: measured[lb])
    assert set(placement.values()) == ({"onnxruntime"} if report["winner"] == "all onnxruntime" else {"mnn"})
    assert report["complete"] and loaded is not None
    x = np.random.default_rng(0).standard_normal((1, 8, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), interpret(g, [x])[0], rtol=1e-3, atol=1e-4)


def test_the_cheap_single_engine_is_built_first_then_the_optimum_then_the_rest_cheapest_first() -> None:
    from edgerun.search.tune import CHEAP_SINGLE_SLACK, _cheap_single, measuring_order

    candidates = [("search", {"a": "mnn", "b": "onnxruntime"}, 0.026), ("all mnn", {"a": "mnn", "b": "mnn"}, 0.028),
                  ("all onnxruntime", {"a": "onnxruntime", "b": "onnxruntime"}, 0.041),
                  ("all reference", {"a": "reference", "b": "reference"}, 2.8),
                  ("search, fewer partitions", {"a": "mnn", "b": "mnn"}, 0.027)]
    builds = [0.8, 0.85, 0.6, 0.001, 0.9]  # estimates for ResNet-18 at load 7
    assert _cheap_single(candidates, builds, 2.0) == 2  # the reference builds cheaper but is modelled 100x behind
    assert measuring_order(builds, 2) == [2, 0, 3, 1, 4]
    assert measuring_order(builds, None) == [0, 3, 2, 1, 4]
    assert _cheap_single(candidates, builds, 0.5) is None  # its build alone would not fit the budget
    candidates[2] = (*candidates[2][:2], 0.026 * CHEAP_SINGLE_SLACK * 1.01)
    assert _cheap_single(candidates, builds, 2.0) == 1  # ORT modelled too far behind: MNN alone is the cheapest


def _ort_and_reference_table(g: Graph, reference_over_ort: float) -> Any:
    """The cost table of `g` on ORT and the reference (fixed figures), the reference modelled at the factor."""
    names = ("onnxruntime", "reference")
    fixed = BackendProfile(5e10, 5e10, 1e9, 1e10, 1e-6, 0.0)
    table = cost_table(g, {n: get_backend(n) for n in names}, dict.fromkeys(names, fixed))
    ort, ref = table.backends.index("onnxruntime"), table.backends.index("reference")
    table.seconds[:, ref] = table.seconds[:, ort] * reference_over_ort
    return table


def _tune_with_ort_over_budget(g: Graph, table: Any, optimum: Any, name: str) -> tuple[Any, Any, Any]:
    """tune_placement on a bounded load in which building ORT's session alone "overruns" the budget.

    The warm-up floor stays at its default: with none, ORT's first call was abandoned at a 0.5 ms cut (3x the best
    warm-up so far) in two fresh-clone CI runs (a busy two-worker host); abandoning is not what these tests check.
    """
    budget = 0.5

    def estimate(placement: dict[str, str]) -> float:
        return 0.0 if set(placement.values()) == {"reference"} else budget

    return tune_placement(g, table, optimum, name, budget_s=budget, build_estimate=estimate)


def _assert_ort_was_built_won_and_runs(g: Graph, placement: Any, report: Any, loaded: Any) -> None:
    by_label = {c["label"]: c for c in report["candidates"]}
    assert by_label["all onnxruntime"]["measured_s"] is not None, by_label  # built anyway: the next net
    assert report["winner"] == "all onnxruntime" and set(placement.values()) == {"onnxruntime"}
    assert report["complete"] and loaded is not None
    x = np.random.default_rng(0).standard_normal((1, 8, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), interpret(g, [x])[0], rtol=1e-3, atol=1e-4)


def test_a_net_that_measures_far_slower_than_modelled_hands_over_to_the_next_close_single_engine(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen in bench/peers.py, idle: on MiniLM the reference alone was modelled 8.5 ms beside a three-engine
    # mix's 8.2 and measured 30.8; as the net it was built first, the mix next, and ORT (8 ms) and MNN were
    # left out "for their build": the 19 ms mix was cached.
    pytest.importorskip("onnxruntime")
    from edgerun.search.placement_search import SearchResult
    from edgerun.search.tune import CHEAP_SINGLE_SLACK

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    g = small_conv_net()
    table = _ort_and_reference_table(g, 1.05)  # the reference misjudged: modelled next to ORT
    ort = table.backends.index("onnxruntime")
    # A mixed optimum: the convs on ORT, the relus on the reference (forced; the model need not agree).
    per_node = ["onnxruntime" if n.op == "conv2d" else "reference" for n in g.nodes]
    assert len(set(per_node)) == 2
    mixed = SearchResult(per_node, float(table.seconds[:, ort].sum()), switches=len(per_node))
    placement, report, loaded = _tune_with_ort_over_budget(g, table, mixed, "net-handover")
    by_label = {c["label"]: c for c in report["candidates"]}
    ref_measured = by_label["all reference"]["measured_s"] or math.inf
    assert ref_measured > CHEAP_SINGLE_SLACK * by_label["all reference"]["modelled_s"]  # really misjudged
    _assert_ort_was_built_won_and_runs(g, placement, report, loaded)


def test_a_single_engine_optimum_that_measures_far_slower_than_modelled_hands_over_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Seen in bench/peers.py: MNN alone on MobileNetV2 was the optimum, modelled 4.8 ms and measured 10.7;
    # ORT, modelled 6.8 (outside SINGLE_SLACK of it), was never timed, and edgerun ran at 1.71x ORT.
    pytest.importorskip("onnxruntime")
    from edgerun.search.placement_search import SearchResult
    from edgerun.search.tune import CHEAP_SINGLE_SLACK, SINGLE_SLACK

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    g = small_conv_net()
    table = _ort_and_reference_table(g, 1 / (1.5 * SINGLE_SLACK))  # the reference misjudged: far ahead
    ref = table.backends.index("reference")
    optimum = SearchResult(["reference"] * len(g.nodes), float(table.seconds[:, ref].sum()), switches=0)
    assert float(table.seconds[:, table.backends.index("onnxruntime")].sum()) <= CHEAP_SINGLE_SLACK * optimum.seconds
    placement, report, loaded = _tune_with_ort_over_budget(g, table, optimum, "single-handover")
    opt = next(c for c in report["candidates"] if c["label"] in ("search", "all reference") and c["measured_s"])
    assert opt["measured_s"] > CHEAP_SINGLE_SLACK * opt["modelled_s"]  # really misjudged
    _assert_ort_was_built_won_and_runs(g, placement, report, loaded)


@pytest.mark.parametrize("ort_over_optimum", [1.6, 2.5])
def test_a_single_engine_optimum_measures_another_single_modelled_within_two_x_while_the_budget_lasts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ort_over_optimum: float) -> None:
    # Seen in bench/peers.py, idle: MNN alone on llama_small was the optimum (modelled 2.35 ms, measured 2.62),
    # ORT was modelled 3.08 (1.31x: outside SINGLE_SLACK) and left out, and it runs the model in 2.07.
    pytest.importorskip("onnxruntime")
    from edgerun.search.placement_search import SearchResult
    from edgerun.search.tune import CHEAP_SINGLE_SLACK, SINGLE_SLACK

    assert SINGLE_SLACK < 1.6 < CHEAP_SINGLE_SLACK < 2.5
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    g = small_conv_net()
    table = _ort_and_reference_table(g, 1.0)
    ort, ref = table.backends.index("onnxruntime"), table.backends.index("reference")
    # Modelled far slower than either runs (so the optimum is not misjudged and hands nothing over).
    table.seconds[:, ref] = 0.1
    table.seconds[:, ort] = 0.1 * ort_over_optimum
    optimum = SearchResult(["reference"] * len(g.nodes), float(table.seconds[:, ref].sum()), switches=0)
    placement, report, _ = tune_placement(g, table, optimum, f"within-two-x-{ort_over_optimum}", budget_s=2.0,
                                          build_estimate=lambda placement: 0.0)
    by_label = {c["label"]: c for c in report["candidates"]}
    if ort_over_optimum < CHEAP_SINGLE_SLACK:  # measured while the budget lasts, and faster for real
        assert by_label["all onnxruntime"]["measured_s"] is not None, by_label
        assert report["winner"] == "all onnxruntime" and set(placement.values()) == {"onnxruntime"}
    else:
        assert by_label["all onnxruntime"]["skipped"] == "the optimum is one engine; modelled slower than it"
        assert set(placement.values()) == {"reference"}
