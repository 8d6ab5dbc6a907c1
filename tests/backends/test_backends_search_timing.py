"""The first-load timing of candidate placements (edgerun.search.timing) on calls with known behaviour."""

from __future__ import annotations

import time

from edgerun.search.timing import steady_seconds


def test_a_candidate_is_not_charged_for_the_threads_the_one_before_it_left_busy() -> None:
    last_a = [0.0]

    def a() -> None:
        time.sleep(0.02)
        last_a[0] = time.perf_counter()

    def b() -> None:  # 5 ms alone; 40 ms while "a's threads" are still busy (within 0.3 s of a's last call)
        time.sleep(0.04 if time.perf_counter() - last_a[0] < 0.3 else 0.005)

    calls = {"a": a, "b": b}
    estimates = {"a": 0.02, "b": 0.04}
    naive = steady_seconds(calls, {}, estimates)  # nothing declared: b is timed while a's threads spin
    assert naive["b"] > naive["a"]
    fair = steady_seconds(calls, {"a": 0.35}, estimates)  # a declares 0.35 s: b's block waits that long
    assert fair["b"] < 0.02 <= fair["a"]


def test_warm_up_fades_out_of_the_figure() -> None:
    count = [0]

    def cold_start() -> None:  # a fresh session: its first calls are slow
        count[0] += 1
        time.sleep(0.03 if count[0] <= 6 else 0.005)

    def steady() -> None:
        time.sleep(0.015)

    got = steady_seconds({"cold": cold_start, "steady": steady}, {}, {"cold": 0.03, "steady": 0.015})
    assert got["cold"] < 0.015 <= got["steady"]


def test_a_spent_budget_still_times_every_candidate_at_least_twice() -> None:
    calls = {"x": [0], "y": [0]}
    got = steady_seconds({k: (lambda c=c: c.append(0)) for k, c in calls.items()}, {}, {"x": 1.0, "y": 1.0},
                         deadline=time.perf_counter())
    assert set(got) == {"x", "y"}
    assert all(len(c) - 1 >= 2 * 2 for c in calls.values())  # 2 rounds of a lead-in call and one timed call
