"""Thresholds when devices leave (hawkBit PR #328): the step population follows the live fleet.

Property tests drive the pure state machine the way the server does (recount the live devices a step covers,
then evaluate) through random interleavings of reports, departures and returns; a scenario test runs the
real server, where devices stop checking in and the step monitor notices without any further report.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from fleet_helpers import FAILING_BODY, FleetServer, make_task
from hypothesis import given, settings
from hypothesis import strategies as st

from edgerun.fleet import rollout
from edgerun.fleet.rollout import RolloutPolicy, RolloutState

policies = st.builds(
    RolloutPolicy,
    steps=st.sampled_from([(100.0,), (10.0, 50.0, 100.0)]),
    min_reports=st.integers(1, 15),
    success_threshold=st.floats(0.5, 1.0),
    error_threshold=st.floats(0.05, 0.6),
    error_min_reports=st.integers(1, 10),
    beta_devices=st.sampled_from([(), ("beta-1",)]),
)
# (kind, device index, outcome): a device reports (even after leaving: its outbox may drain late), leaves
# (its last check-in ages past the liveness window), returns, or the monitor ticks with nothing new.
events = st.lists(st.tuples(st.sampled_from(["report", "report", "leave", "return", "tick"]),
                            st.integers(0, 11), st.booleans()), max_size=120)


def breached(state: RolloutState, policy: RolloutPolicy) -> bool:
    total = state.step_success + state.step_failure
    return total >= state.needed(policy.error_min_reports) and state.step_failure / total >= policy.error_threshold


@dataclass
class Fleet:
    """The model: which devices are live, and what each reported in the current step."""

    size: int
    live: set[int] = field(default_factory=set)
    reported: dict[int, list[bool]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.live = set(range(self.size))


def enter_step(state: RolloutState, policy: RolloutPolicy, fleet: Fleet) -> RolloutState:
    """What the server does on entering a step: count who it covers; a step covering nobody is skipped."""
    fleet.reported = {}
    while state.active and state.population == -1 and state.stage in ("beta", "gray"):
        state = rollout.skip_empty_step(replace(state, population=len(fleet.live)), policy)
        if state.population != -1:
            break
    return state


@settings(max_examples=300, deadline=None)
@given(policies, st.integers(1, 12), events)
def test_departures_never_pass_a_breach_never_stall_and_never_count_as_success(
        policy: RolloutPolicy, size: int, stream: list[tuple[str, int, bool]]) -> None:
    fleet = Fleet(size)
    state = enter_step(rollout.initial_state(policy), policy, fleet)
    for kind, index, ok in stream:
        device = index % size
        if not state.active or state.stage == "completed":
            break
        before = state
        if kind == "leave":
            fleet.live.discard(device)
        elif kind == "return":
            fleet.live.add(device)
        live = replace(before, population=len(fleet.live))
        if kind == "report":
            fleet.reported.setdefault(device, []).append(ok)
            counted = replace(live, step_success=live.step_success + ok, step_failure=live.step_failure + (not ok))
            state = rollout.apply_reports(live, policy, int(ok), int(not ok))
        else:
            counted = live
            state = rollout.recount(before, policy, len(fleet.live))
            # A departure or return changes who counts, never what was reported.
            assert (state.step_success, state.step_failure) == (before.step_success, before.step_failure) \
                or state.stage != before.stage or state.step != before.step
        moved = (state.stage, state.step) != (before.stage, before.step)
        # The counts are exactly the reports delivered in this step: absence adds nothing.
        delivered = [o for outcomes in fleet.reported.values() for o in outcomes]
        assert (counted.step_success, counted.step_failure) == (sum(delivered), len(delivered) - sum(delivered))
        if breached(counted, policy):
            assert state.stage == "rolled_back", (counted, state)  # never advances past a breach
        elif moved:
            # An advance needs real reports: at least one, enough for the live devices, at the success rate.
            total = counted.step_success + counted.step_failure
            assert total >= max(1, min(policy.min_reports, len(fleet.live)))
            assert counted.step_success / total >= policy.success_threshold
        else:
            # Never stuck: the state is a fixpoint, so no step waits while its evidence already suffices...
            assert rollout.evaluate(state, policy) == state
            # ...in particular, once every live device reported and all reports succeeded, the step moves on.
            if fleet.live and fleet.live <= set(fleet.reported) and state.stage in ("beta", "gray") \
                    and not state.paused and all(delivered):
                raise AssertionError(f"stuck although every live device reported success: {state}")
        if moved:
            state = enter_step(state, policy, fleet)


@settings(max_examples=100, deadline=None)
@given(policies, st.integers(1, 12), st.integers(0, 12))
def test_a_step_whose_devices_all_left_without_reporting_does_not_advance(policy: RolloutPolicy, size: int,
                                                                          leavers: int) -> None:
    fleet = Fleet(size)
    state = enter_step(rollout.initial_state(policy), policy, fleet)
    start = (state.stage, state.step)
    for device in range(size):  # everyone leaves; the monitor ticks after each departure
        fleet.live.discard(device)
        state = rollout.recount(state, policy, len(fleet.live))
    for _ in range(3):
        state = rollout.recount(state, policy, 0)
    assert (state.stage, state.step) == start and state.step_success == state.step_failure == 0
    # They come back (or others join): their reports count again, and one success is enough for one device.
    state = rollout.recount(state, policy, 1)
    state = rollout.apply_reports(state, policy, 1, 0)
    assert (state.stage, state.step) != start


def test_departure_turns_a_waiting_step_into_a_rollback_when_the_rest_failed() -> None:
    policy = RolloutPolicy(steps=(100.0,), min_reports=10, error_min_reports=4, error_threshold=0.5)
    state = replace(rollout.initial_state(policy), population=8)
    state = rollout.apply_reports(state, policy, 1, 2)  # 3 reports < 4 needed for a trusted error rate
    assert state.stage == "gray"
    state = rollout.recount(state, policy, 3)  # five silent devices left: the three remaining all reported
    assert state.stage == "rolled_back"


# ---- the real server: devices stop checking in, and the step monitor acts without another report ------------

def _wait_for(predicate, timeout_s: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def _checkin_all(agents: list, rounds: int = 1) -> None:  # type: ignore[type-arg]
    for _ in range(rounds):
        for a in agents:
            a.check_in()


def test_server_advances_and_rolls_back_when_devices_leave_mid_step(shared_server: FleetServer,
                                                                    tmp_path: Path) -> None:
    admin = shared_server.admin()
    window = 5.0
    policy = {"steps": [100], "min_reports": 20, "error_min_reports": 20, "error_threshold": 0.5,
              "active_window_s": window}
    agents = [shared_server.agent(f"leave-{i}", tmp_path / f"leave-{i}") for i in range(4)]
    _checkin_all(agents)
    good = admin.publish(make_task(tmp_path, "leaving-good", 2), shared_server.keys, policy)
    bad = admin.publish(make_task(tmp_path, "leaving-bad", 2, body=FAILING_BODY), shared_server.keys, policy)
    _checkin_all(agents)
    stayers = agents[:2]
    for a in stayers:  # two devices report on both tasks; the other two are live and silent
        assert a.run_task("leaving-good").outcome == "success"
        assert a.run_task("leaving-bad").outcome == "failure"
        a.flush_reports()
    # Two reports of four live devices: neither the success nor the failure evidence is complete yet.
    assert admin.release(good["id"])["stage"] == "gray"
    assert admin.release(bad["id"])["stage"] == "gray"
    assert admin.release(good["id"])["step_population"] == 4
    # The two silent devices go away; the two that reported keep checking in. No further report arrives,
    # yet once the window passes the step monitor sees that every remaining device has reported: the good
    # release advances, and the bad one, two failures of the two live devices, rolls back.
    deadline = time.monotonic() + window + 1.5
    while time.monotonic() < deadline:
        _checkin_all(stayers)
        time.sleep(0.3)
    assert _wait_for(lambda: (_checkin_all(stayers), admin.release(good["id"])["stage"])[1] == "completed")
    assert _wait_for(lambda: admin.release(bad["id"])["stage"] == "rolled_back")
    assert any(e["action"] == "advance:completed" and e["actor"] == "monitor" for e in admin.audit(good["id"]))
    assert any(e["action"] == "rollback" and e["actor"] == "monitor" for e in admin.audit(bad["id"]))
    stayers[0].check_in()
    assert "leaving-bad" not in stayers[0].profile().tasks  # a first release's rollback removes the task
