"""The staged-rollout state machine, as pure functions over plain data so that it can be property-tested.

    simulation ──pass──► beta ──► gray[0] ──► gray[1] ──► … ──► gray[last] ──► completed
        │ fail             │          │            │                  │              │
        ▼                  ▼          ▼            ▼                  ▼              ▼
     aborted          rolled_back (error threshold breached, at any stage after simulation)
    operator: pause/resume (blocks advancing only; a breach still rolls back), abort (= manual rollback)

Each report batch is applied and then `evaluate` runs in the same transaction, so the breach and the
rollback are one step: the very next check-in of any device already sees the rolled-back state.
Rates are computed over reports received in the current step, never over group sizes, so devices that
leave a group cannot push a rate past 100% or divide by zero (the hawkBit PR #328 bug). The report counts a
step needs are capped by its `population`: the devices the step covers that checked in within the liveness
window (`active_window_s`). The server recounts it at every evaluation (`recount`), so a step whose devices
went offline asks only for the reports its remaining devices can send, and a 1% step of a small fleet does
not wait forever. A departed device's absence is never evidence: rates are over reports actually received,
and a step needs at least one report, so a step whose devices all left waits for them (or for new ones).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from edgerun.fleet.errors import FleetError

STAGES = ("simulation", "beta", "gray", "completed", "rolled_back", "aborted")
TERMINAL = ("rolled_back", "aborted")
DEFAULT_STEPS = (1.0, 5.0, 20.0, 50.0, 100.0)


@dataclass(frozen=True)
class RolloutPolicy:
    steps: tuple[float, ...] = DEFAULT_STEPS
    min_reports: int = 20            # reports a step needs before it may advance
    success_threshold: float = 0.95  # success rate a step needs to advance
    error_threshold: float = 0.2     # failure rate that triggers automatic rollback
    error_min_reports: int = 5       # reports needed before the error rate is trusted
    inconclusive_after: int = 0      # pause a step that has this many reports but neither passes nor breaches (0 = 10 × min_reports)
    active_window_s: float = 86400.0  # liveness window: devices seen within it count towards a step's population
    beta_devices: tuple[str, ...] = ()
    simulation_agents: int = 0

    def __post_init__(self) -> None:
        if not self.steps or any(not 0 < s <= 100 for s in self.steps) or list(self.steps) != sorted(self.steps):
            raise FleetError("rollout steps must be increasing percentages in (0, 100]")
        if self.steps[-1] != 100:
            raise FleetError("the last rollout step must be 100%")
        if not 0 <= self.success_threshold <= 1 or not 0 < self.error_threshold <= 1:
            raise FleetError("thresholds must be fractions in [0, 1]")
        if self.min_reports < 1 or self.error_min_reports < 1:
            raise FleetError("min_reports and error_min_reports must be at least 1")

    @property
    def inconclusive_limit(self) -> int:
        return self.inconclusive_after or 10 * self.min_reports

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RolloutPolicy:
        d = dict(d)
        for key in ("steps", "beta_devices"):
            if key in d:
                d[key] = tuple(d[key])
        unknown = set(d) - set(cls.__dataclass_fields__)
        if unknown:
            raise FleetError(f"unknown rollout policy field(s): {', '.join(sorted(unknown))}")
        return cls(**d)

    def as_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class RolloutState:
    stage: str = "simulation"
    step: int = 0
    paused: bool = False
    step_success: int = 0
    step_failure: int = 0
    reason: str = ""
    population: int = -1  # active devices the current step covers; -1 = unknown (use the policy's counts)
    events: tuple[str, ...] = field(default=(), compare=False)

    @property
    def active(self) -> bool:
        return self.stage not in TERMINAL

    def needed(self, count: int) -> int:
        """A report count from the policy, capped by the step's population."""
        return max(1, min(count, self.population)) if self.population >= 0 else count


def initial_state(policy: RolloutPolicy) -> RolloutState:
    if policy.simulation_agents > 0:
        return RolloutState(stage="simulation")
    return RolloutState(stage="beta" if policy.beta_devices else "gray")


def exposure_percent(state: RolloutState, policy: RolloutPolicy) -> float:
    """Share of the targeted (non-beta) devices that get this release now."""
    if state.stage == "gray":
        return policy.steps[state.step]
    if state.stage == "completed":
        return 100.0
    return 0.0


def _with_event(state: RolloutState, event: str, **changes: Any) -> RolloutState:
    return replace(state, events=(*state.events, event), **changes)


def _next_stage(state: RolloutState, policy: RolloutPolicy) -> RolloutState:
    reset = {"step_success": 0, "step_failure": 0, "population": -1}
    if state.stage == "simulation":
        target = "beta" if policy.beta_devices else "gray"
        return _with_event(state, f"advance:{target}", stage=target, step=0, **reset)
    if state.stage == "beta":
        return _with_event(state, "advance:gray:0", stage="gray", step=0, **reset)
    if state.stage == "gray" and state.step + 1 < len(policy.steps):
        return _with_event(state, f"advance:gray:{state.step + 1}", step=state.step + 1, **reset)
    return _with_event(state, "advance:completed", stage="completed", step=len(policy.steps) - 1, **reset)


def evaluate(state: RolloutState, policy: RolloutPolicy) -> RolloutState:
    """Apply the thresholds once: roll back on a breach, else advance a step that passed, else wait."""
    if state.stage in TERMINAL or state.stage == "simulation":
        return state
    total = state.step_success + state.step_failure
    if total >= state.needed(policy.error_min_reports) and state.step_failure / total >= policy.error_threshold:
        return _with_event(state, "rollback", stage="rolled_back", paused=False,
                           reason=f"failure rate {state.step_failure}/{total} ≥ {policy.error_threshold:g}")
    if state.stage == "completed" or state.paused:
        return state
    if total >= state.needed(policy.min_reports) and state.step_success / total >= policy.success_threshold:
        return _next_stage(state, policy)
    if total >= policy.inconclusive_limit:
        return _with_event(state, "pause:inconclusive", paused=True,
                           reason=f"inconclusive: success rate {state.step_success}/{total} after {total} reports")
    return state


def apply_reports(state: RolloutState, policy: RolloutPolicy, success: int, failure: int) -> RolloutState:
    if state.stage in TERMINAL or state.stage == "simulation":
        return state
    counted = replace(state, step_success=state.step_success + success, step_failure=state.step_failure + failure)
    return evaluate(counted, policy)


def recount(state: RolloutState, policy: RolloutPolicy, population: int) -> RolloutState:
    """Mid-step: the live devices the step covers changed (some left, some came); evaluate against them.
    Unlike `skip_empty_step` at a step's start, a step that lost every device does not move on: its
    devices received the release, and their silence is not a success."""
    if state.stage not in ("beta", "gray"):
        return state
    return evaluate(replace(state, population=max(0, population)), policy)


def skip_empty_step(state: RolloutState, policy: RolloutPolicy) -> RolloutState:
    """A beta or gray step that covers no active device has no evidence to wait for: move on. Except the last
    gray step: moving on from it is completing, and a release is never completed without a report (one
    published before its devices enrol would otherwise be completed at once, and reach every device that
    enrols later with no step ever having seen it run); it waits at full exposure for devices to join."""
    if state.stage not in ("beta", "gray") or state.paused or state.population != 0:
        return state
    if state.stage == "gray" and state.step + 1 >= len(policy.steps):
        return state
    return _next_stage(_with_event(state, "skip:empty-step"), policy)


def simulation_finished(state: RolloutState, policy: RolloutPolicy, passed: bool, detail: str) -> RolloutState:
    if state.stage != "simulation":
        return state  # idempotent: a second simulator finishing late changes nothing
    if not passed:
        return _with_event(state, "abort:simulation", stage="aborted", reason=f"simulation failed: {detail}")
    return _next_stage(state, policy)


def pause(state: RolloutState) -> RolloutState:
    if not state.active or state.paused:
        return state
    return _with_event(state, "pause", paused=True, reason="paused by operator")


def resume(state: RolloutState) -> RolloutState:
    if not state.active or not state.paused:
        return state
    # A fresh count after a pause: the operator resumed because the old evidence was inconclusive.
    return _with_event(state, "resume", paused=False, reason="", step_success=0, step_failure=0)


def abort(state: RolloutState) -> RolloutState:
    if not state.active:
        return state
    return _with_event(state, "abort", stage="aborted", paused=False, reason="aborted by operator")
