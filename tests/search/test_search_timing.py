"""The first-load timing of candidate placements (edgerun.search.timing) on a fake clock: calls whose time
depends on what ran before them. Times are binary fractions, so sums on the fake clock are exact."""

from __future__ import annotations

from search_testkit import FakeClock

from edgerun.search.timing import BLOCK_CALLS, steady_seconds

A, B = 2.0**-5, 2.0**-8  # 31 ms, 4 ms


def test_a_candidate_is_not_charged_for_the_threads_the_one_before_it_left_busy() -> None:
    clock = FakeClock()
    last_a = [-1.0]

    def a() -> None:
        clock.advance(A)
        last_a[0] = clock()

    def b() -> None:  # B alone; 16 B while "a's threads" are still busy (within 1 s of a's last call)
        clock.advance(16 * B if clock() - last_a[0] < 1.0 else B)

    calls = {"a": a, "b": b}
    estimates = {"a": A, "b": 16 * B}
    naive = steady_seconds(calls, {}, estimates, clock=clock)  # nothing declared: b is timed while a's threads spin
    assert naive == {"a": A, "b": 16 * B}
    fair = steady_seconds(calls, {"a": 1.25}, estimates, clock=clock)  # a declares 1.25 s: b's block waits
    assert fair == {"a": A, "b": B}


def test_warm_up_fades_out_of_the_figure() -> None:
    clock = FakeClock()
    count = [0]

    def cold_start() -> None:  # a fresh session: its first six calls are slow
        count[0] += 1
        clock.advance(A if count[0] <= 6 else B)

    got = steady_seconds({"cold": cold_start, "steady": lambda: clock.advance(4 * B)}, {},
                         {"cold": A, "steady": 4 * B}, clock=clock)
    assert got == {"cold": B, "steady": 4 * B}


def test_a_spent_budget_still_times_every_candidate_at_least_twice() -> None:
    clock = FakeClock()
    calls = {"x": [0], "y": [0]}
    got = steady_seconds({k: (lambda c=c: (c.append(0), clock.advance(1.0))) for k, c in calls.items()}, {},
                         {"x": 1.0, "y": 1.0}, deadline=clock(), clock=clock)
    assert got == {"x": 1.0, "y": 1.0}
    assert all(len(c) - 1 == 2 * 2 for c in calls.values())  # 2 rounds of a lead-in call and one timed call


def test_time_left_buys_full_blocks_and_more_rounds_until_one_leads_decisively() -> None:
    clock = FakeClock()
    calls = {"x": [0], "y": [0]}
    got = steady_seconds({k: (lambda c=c: (c.append(0), clock.advance(B))) for k, c in calls.items()}, {},
                         {"x": B, "y": B}, deadline=10.0, clock=clock)
    assert got == {"x": B, "y": B}
    # Equal times never lead by DECISIVE: every one of MAX_ROUNDS rounds ran, each a lead-in and a block.
    assert all(len(c) - 1 == 8 * (1 + BLOCK_CALLS) for c in calls.values())
