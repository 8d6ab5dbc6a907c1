"""All tasks' trigger conditions in one trie (Walle §5.1), matched against each event as it arrives.

An event never scans the conditions. It touches three kinds of edges, each found by a dict lookup on one
of its ids (event id, page id, event@page):
- first steps (edges leaving a root): always active;
- relaxed later steps that are *armed*: their parent's partial match changed since the edge last
  advanced, so the next event with the edge's id extends it (docs/stream.md: the newest prefix, extended
  by the first matching event after it);
- strict later steps below the nodes the previous event advanced (the strict frontier).
So the work per event follows the partial matches that move, not the number of conditions.
`naive_matcher.NaiveMatcher` implements the same semantics one condition at a time, as the oracle.
"""

from __future__ import annotations

from collections.abc import Iterable

from edgerun.stream.events import Event
from edgerun.stream.trigger_spec import STRICT, TriggerCondition, TriggerMatch

# A partial match of a prefix: (events, min event time, max event time). A tuple, not a class, because
# building one is the innermost step of matching and a tuple costs a fraction of an __init__ call.
_Partial = tuple[tuple[Event, ...], int, int]


class _TaskEntry:
    __slots__ = ("condition", "task_id", "within_ms")

    def __init__(self, task_id: str, condition: TriggerCondition) -> None:
        self.task_id = task_id
        self.condition = condition
        self.within_ms = condition.within_ms


class _Node:
    __slots__ = ("armed", "children", "key", "parent", "pending", "relaxed_children", "strict", "tasks")

    def __init__(self, parent: _Node | None, key: str, strict: bool) -> None:
        self.parent = parent
        self.key = key
        self.strict = strict
        self.children: dict[str, _Node] = {}
        self.relaxed_children: list[_Node] = []  # children armed when this node's partial changes
        self.tasks: list[_TaskEntry] = []
        self.pending: _Partial | None = None
        self.armed = False


class TriggerTrie:
    """Matches the trigger conditions of many tasks; `match(event)` returns the matches the event completes."""

    def __init__(self) -> None:
        self._conditions: dict[str, list[TriggerCondition]] = {}
        self._build()

    def _build(self) -> None:
        self._roots = {True: _Node(None, "", True), False: _Node(None, "", False)}
        self._first_steps: dict[str, list[_Node]] = {}
        self._armed: dict[str, list[_Node]] = {}  # armed relaxed edges (their child nodes) by trigger id
        self._strict_frontier: list[_Node] = []  # strict nodes the previous event advanced
        self._node_count = 2
        for task_id, conditions in self._conditions.items():
            for condition in conditions:
                self._insert(task_id, condition)

    def _insert(self, task_id: str, condition: TriggerCondition) -> None:
        strict = condition.contiguity == STRICT
        node = self._roots[strict]
        for trigger_id in condition.sequence:
            child = node.children.get(trigger_id)
            if child is None:
                child = node.children[trigger_id] = _Node(node, trigger_id, strict)
                if node.parent is None:
                    self._first_steps.setdefault(trigger_id, []).append(child)
                elif not strict:
                    node.relaxed_children.append(child)
                self._node_count += 1
            node = child
        node.tasks.append(_TaskEntry(task_id, condition))

    def add_task(self, task_id: str, conditions: Iterable[TriggerCondition]) -> None:
        """Registers (or re-registers) a task's conditions; other tasks' pending matches are kept."""
        if task_id in self._conditions:
            self.remove_task(task_id)
        conditions = list(conditions)
        self._conditions[task_id] = conditions
        for condition in conditions:
            self._insert(task_id, condition)

    def remove_task(self, task_id: str) -> None:
        """Removes a task. The trie is rebuilt (removal is rare), which drops pending partial matches."""
        if self._conditions.pop(task_id, None) is not None:
            self._build()

    @property
    def task_ids(self) -> list[str]:
        return list(self._conditions)

    @property
    def node_count(self) -> int:
        return self._node_count

    def match(self, event: Event, fire: bool = True) -> list[TriggerMatch]:
        """Advances all conditions by `event`; `fire=False` only rebuilds pending state (replay after restart).

        Every edge reads its parent's partial as it was before this event, because the new partials are
        applied at the end: one event advances a condition by one step at most.
        """
        matches: list[TriggerMatch] = []
        advanced: list[tuple[_Node, _Partial]] = []
        t = event.time_ms
        keys = event.keys
        for node in self._strict_frontier:
            prefix = node.pending
            events, tmin, tmax = prefix  # type: ignore[misc]
            for key in keys:
                child = node.children.get(key)
                if child is not None:
                    extended = ((*events, event), t if t < tmin else tmin, t if t > tmax else tmax)
                    if child.tasks:
                        self._fire(child, extended, fire, matches)
                    if child.children:
                        advanced.append((child, extended))
        first_steps, armed = self._first_steps, self._armed
        for key in keys:
            starting = first_steps.get(key)
            if starting is not None:
                # Every condition starting with this id starts here: one partial shared by all of them.
                fresh: _Partial = ((event,), t, t)
                for child in starting:
                    if child.tasks:
                        self._fire(child, fresh, fire, matches)
                    if child.children:
                        advanced.append((child, fresh))
            waiting = armed.pop(key, None)
            if waiting is not None:
                for child in waiting:
                    child.armed = False
                    events, tmin, tmax = child.parent.pending  # type: ignore[union-attr,misc]
                    extended = ((*events, event), t if t < tmin else tmin, t if t > tmax else tmax)
                    if child.tasks:
                        self._fire(child, extended, fire, matches)
                    if child.children:
                        advanced.append((child, extended))
        frontier: list[_Node] = []
        for node, extended in advanced:
            node.pending = extended
            if node.strict:
                frontier.append(node)
                continue
            for child in node.relaxed_children:
                if not child.armed:
                    child.armed = True
                    waiting = armed.get(child.key)
                    if waiting is None:
                        armed[child.key] = [child]
                    else:
                        waiting.append(child)
        self._strict_frontier = frontier
        return matches

    @staticmethod
    def _fire(node: _Node, extended: _Partial, fire: bool, matches: list[TriggerMatch]) -> None:
        if not fire:
            return
        span = extended[2] - extended[1]
        for entry in node.tasks:
            if entry.within_ms is None or span <= entry.within_ms:
                matches.append(TriggerMatch(entry.task_id, entry.condition, extended[0]))
