"""Property tests of the rollout state machine over random success/failure report streams."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from edgerun.fleet import rollout
from edgerun.fleet.rollout import RolloutPolicy, RolloutState

policies = st.builds(
    RolloutPolicy,
    steps=st.sampled_from([(100.0,), (1.0, 5.0, 20.0, 50.0, 100.0), (10.0, 100.0)]),
    min_reports=st.integers(1, 30),
    success_threshold=st.floats(0.5, 1.0),
    error_threshold=st.floats(0.05, 0.6),
    error_min_reports=st.integers(1, 20),
    beta_devices=st.sampled_from([(), ("beta-1",)]),
)
# A stream of report batches, each (successes, failures), as one device check-in round would carry.
streams = st.lists(st.tuples(st.integers(0, 5), st.integers(0, 5)), max_size=80)


def breached(state: RolloutState, policy: RolloutPolicy) -> bool:
    total = state.step_success + state.step_failure
    return total >= state.needed(policy.error_min_reports) and state.step_failure / total >= policy.error_threshold


@settings(max_examples=300, deadline=None)
@given(policies, streams, st.lists(st.integers(-1, 40), min_size=1))
def test_never_advances_past_a_breach_and_rolls_back_in_the_same_round(policy: RolloutPolicy,
                                                                        stream: list[tuple[int, int]],
                                                                        populations: list[int]) -> None:
    state = rollout.initial_state(policy)
    for i, (ok, bad) in enumerate(stream):
        if state.population == -1 and state.active:
            # What the server does on entering a step: count the devices it covers (maybe none).
            state = rollout.skip_empty_step(replace(state, population=populations[i % len(populations)]), policy)
        before = state
        counted = replace(before, step_success=before.step_success + ok, step_failure=before.step_failure + bad)
        state = rollout.apply_reports(before, policy, ok, bad)
        if before.stage in rollout.TERMINAL:
            assert state == before  # terminal states absorb everything
            continue
        if breached(counted, policy):
            # The breach is acted on in the very round that carried it: no further advance, rollback now.
            assert state.stage == "rolled_back", (before, counted, state)
        elif state.stage != before.stage or state.step != before.step:
            total = counted.step_success + counted.step_failure
            assert total >= counted.needed(policy.min_reports) >= 1
            assert counted.step_success / total >= policy.success_threshold
            assert not before.paused
        # Exposure never shrinks while the release is live.
        if state.active:
            assert rollout.exposure_percent(state, policy) >= rollout.exposure_percent(before, policy)


@settings(max_examples=200, deadline=None)
@given(policies, streams, st.lists(st.sampled_from(["pause", "resume", "abort"]), max_size=10))
def test_operator_actions_are_idempotent_and_pause_blocks_advancing(policy: RolloutPolicy,
                                                                    stream: list[tuple[int, int]],
                                                                    actions: list[str]) -> None:
    state = rollout.initial_state(policy)
    ops = {"pause": rollout.pause, "resume": rollout.resume, "abort": rollout.abort}
    for i, (ok, bad) in enumerate(stream):
        if actions and i % 3 == 0:
            op = ops[actions[i % len(actions)]]
            once = op(state)
            twice = op(once)
            assert (twice.stage, twice.step, twice.paused) == (once.stage, once.step, once.paused)
            assert twice.events == once.events  # the repeat adds no audit event
            state = once
        before = state
        state = rollout.apply_reports(state, policy, ok, bad)
        if before.paused and state.stage not in rollout.TERMINAL:
            assert (state.stage, state.step) == (before.stage, before.step)


def test_simulation_gate_and_full_walk() -> None:
    policy = RolloutPolicy(steps=(1.0, 50.0, 100.0), min_reports=2, simulation_agents=3, beta_devices=("b",))
    s = rollout.initial_state(policy)
    assert s.stage == "simulation" and rollout.apply_reports(s, policy, 100, 0) == s
    assert rollout.simulation_finished(s, policy, False, "boom").stage == "aborted"
    s = rollout.simulation_finished(s, policy, True, "")
    assert s.stage == "beta"
    assert rollout.simulation_finished(s, policy, True, "") == s  # a late second simulator changes nothing
    seen = []
    while s.stage != "completed":
        s = rollout.apply_reports(s, policy, 2, 0)
        seen.append((s.stage, rollout.exposure_percent(s, policy)))
    assert seen == [("gray", 1.0), ("gray", 50.0), ("gray", 100.0), ("completed", 100.0)]
    assert rollout.apply_reports(s, policy, 0, 10).stage == "rolled_back"  # still monitored when complete


def test_inconclusive_step_pauses_instead_of_hanging() -> None:
    policy = RolloutPolicy(steps=(100.0,), min_reports=10, success_threshold=0.95, error_threshold=0.5)
    s = rollout.initial_state(policy)
    for _ in range(10):
        s = rollout.apply_reports(s, policy, 9, 1)  # 90%: neither passes nor breaches
    assert s.paused and s.reason.startswith("inconclusive") and s.stage == "gray"
    s = rollout.resume(s)
    assert not s.paused and s.step_success == 0


@settings(max_examples=200, deadline=None)
@given(policies, st.lists(st.integers(0, 3), min_size=1, max_size=12))
def test_a_release_never_completes_without_a_report_in_its_last_step(policy: RolloutPolicy,
                                                                     populations: list[int]) -> None:
    """Empty steps are skipped on entering them, but the last one waits: nobody may be skipped into
    'completed' (a release published before its devices enrol must not reach them all unseen)."""
    state = rollout.initial_state(replace(policy, simulation_agents=0))
    for population in populations:
        if state.population != -1:
            break
        state = rollout.skip_empty_step(replace(state, population=population), policy)
    assert state.stage != "completed"
    if populations[0] == 0 and state.stage == "gray" and state.population == 0:
        assert state.step == len(policy.steps) - 1  # every empty step before the last was skipped
        assert rollout.recount(state, policy, 0).stage == "gray"  # still waiting for a device
        assert rollout.apply_reports(state, policy, 1, 0).stage == "completed"  # one report of its one device
