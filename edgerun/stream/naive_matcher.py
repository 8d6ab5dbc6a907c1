"""The trigger semantics of docs/stream.md, one condition at a time.

This is the oracle the trie is tested against and the baseline of bench/stream_triggers.py: every event is
checked against every step of every condition. It shares nothing between conditions, so it is easy to read.
"""

from __future__ import annotations

from collections.abc import Iterable

from edgerun.stream.events import Event
from edgerun.stream.trigger_spec import STRICT, TriggerCondition, TriggerMatch

_Partial = tuple[tuple[Event, ...], int, int]  # events, min event time, max event time


class _ConditionState:
    __slots__ = ("condition", "extended_from", "pending", "pending_seq", "strict", "task_id")

    def __init__(self, task_id: str, condition: TriggerCondition) -> None:
        self.task_id = task_id
        self.condition = condition
        self.strict = condition.contiguity == STRICT
        steps = len(condition.sequence)
        # pending[i]: the partial match of steps 0..i, and the number of the event that made it.
        self.pending: list[_Partial | None] = [None] * steps
        self.pending_seq = [-1] * steps
        # extended_from[i]: the partial of steps 0..i-1 that step i last extended. Relaxed step i extends
        # a partial once: with the first matching event after that partial was formed.
        self.extended_from: list[_Partial | None] = [None] * steps


class NaiveMatcher:
    """Same interface and results as TriggerTrie, by scanning every condition for every event."""

    def __init__(self) -> None:
        self._states: list[_ConditionState] = []
        self._seq = 0

    def add_task(self, task_id: str, conditions: Iterable[TriggerCondition]) -> None:
        self.remove_task(task_id)
        self._states.extend(_ConditionState(task_id, c) for c in conditions)

    def remove_task(self, task_id: str) -> None:
        self._states = [s for s in self._states if s.task_id != task_id]

    def match(self, event: Event, fire: bool = True) -> list[TriggerMatch]:
        seq = self._seq = self._seq + 1
        keys = event.keys
        t = event.time_ms
        matches: list[TriggerMatch] = []
        for state in self._states:
            sequence = state.condition.sequence
            last = len(sequence) - 1
            updates: list[tuple[int, _Partial]] = []
            for i, trigger_id in enumerate(sequence):
                if trigger_id not in keys:
                    continue
                if i == 0:
                    extended: _Partial = ((event,), t, t)
                else:
                    prefix = state.pending[i - 1]
                    if prefix is None:
                        continue
                    if state.strict and state.pending_seq[i - 1] != seq - 1:
                        continue
                    if not state.strict and state.extended_from[i] is prefix:
                        continue
                    state.extended_from[i] = prefix
                    extended = ((*prefix[0], event), min(prefix[1], t), max(prefix[2], t))
                if i == last:
                    within = state.condition.within_ms
                    if fire and (within is None or extended[2] - extended[1] <= within):
                        matches.append(TriggerMatch(state.task_id, state.condition, extended[0]))
                else:
                    updates.append((i, extended))
            for i, extended in updates:
                state.pending[i] = extended
                state.pending_seq[i] = seq
        return matches
