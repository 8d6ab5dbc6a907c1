"""The trigger-condition format of a task config (`triggers`), and what a match hands to the task.

Format and semantics are specified in docs/stream.md; this module only parses and validates.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from edgerun.errors import EdgerunError
from edgerun.stream.events import Event

STRICT = "strict"  # Flink CEP `next`: each step is the very next event
RELAXED = "relaxed"  # Flink CEP `followedBy`: other events may come between the steps (the default)
DEFAULT_WITHIN_MS: int | None = 1_800_000
CAPTURE_MATCHED = "matched"
CAPTURE_SPAN = "span"
CAPTURE_PAGE = "page"
CAPTURES = (CAPTURE_MATCHED, CAPTURE_SPAN, CAPTURE_PAGE)


class TriggerSpecError(EdgerunError):
    """A task's `triggers` config is malformed."""


@dataclass(frozen=True)
class TriggerCondition:
    sequence: tuple[str, ...]
    contiguity: str = RELAXED
    within_ms: int | None = DEFAULT_WITHIN_MS
    capture: str = CAPTURE_MATCHED

    def to_json(self) -> dict[str, Any]:
        return {"sequence": list(self.sequence), "contiguity": self.contiguity,
                "within_s": None if self.within_ms is None else self.within_ms / 1000, "capture": self.capture}


def parse_condition(raw: Any) -> TriggerCondition:
    """One condition: a list of trigger ids, or {"sequence", "contiguity", "within_s", "capture"}."""
    if isinstance(raw, TriggerCondition):
        return raw
    if isinstance(raw, str):
        raise TriggerSpecError(f"a trigger condition is a list of ids, not the string {raw!r}; write [{raw!r}]")
    if isinstance(raw, Sequence):
        raw = {"sequence": list(raw)}
    if not isinstance(raw, dict):
        raise TriggerSpecError(f"a trigger condition is a list or an object, got {type(raw).__name__}")
    unknown = set(raw) - {"sequence", "contiguity", "within_s", "capture"}
    if unknown:
        raise TriggerSpecError(f"unknown trigger fields {sorted(unknown)}")
    sequence = raw.get("sequence")
    if (not isinstance(sequence, list | tuple) or not sequence
            or not all(isinstance(step, str) and step for step in sequence)):
        raise TriggerSpecError(f"'sequence' must be a non-empty list of trigger ids, got {sequence!r}")
    contiguity = raw.get("contiguity", RELAXED)
    if contiguity not in (STRICT, RELAXED):
        raise TriggerSpecError(f"'contiguity' must be {STRICT!r} or {RELAXED!r}, got {contiguity!r}")
    within_ms = DEFAULT_WITHIN_MS
    if "within_s" in raw:
        within_s = raw["within_s"]
        if within_s is not None and (isinstance(within_s, bool) or not isinstance(within_s, int | float)
                                     or within_s < 0):
            raise TriggerSpecError(f"'within_s' must be a non-negative number or null, got {within_s!r}")
        within_ms = None if within_s is None else round(within_s * 1000)
    capture = raw.get("capture", CAPTURE_MATCHED)
    if capture not in CAPTURES:
        raise TriggerSpecError(f"'capture' must be one of {', '.join(map(repr, CAPTURES))}, got {capture!r}")
    return TriggerCondition(tuple(sequence), contiguity, within_ms, capture)


def parse_triggers(raw: Any) -> list[TriggerCondition]:
    """A task's `triggers` field: a list of conditions, any of which runs the task."""
    if not isinstance(raw, list | tuple) or not raw:
        raise TriggerSpecError(f"'triggers' must be a non-empty list of conditions, got {raw!r}")
    # A bare list of ids is one condition, not a list of one-step conditions.
    if all(isinstance(step, str) for step in raw):
        return [parse_condition(list(raw))]
    return [parse_condition(item) for item in raw]


class TriggerMatch(NamedTuple):
    """A condition of a task matched: `events` are the matched events (or the captured span).

    A NamedTuple because the trie builds one per match on its hot path."""

    task_id: str
    condition: TriggerCondition
    events: tuple[Event, ...]

    @property
    def record_id(self) -> str:
        """Idempotent id of the output of this match: a re-run after a crash stores under the same id."""
        digest = hashlib.sha256(self.task_id.encode())
        # Two conditions of one task can match the same events; each match is its own record.
        digest.update(json.dumps(self.condition.to_json(), sort_keys=True).encode())
        for event in self.events:
            digest.update(b"\0" + event.uid.encode())
        return digest.hexdigest()[:32]

    def key(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        return (self.task_id, self.condition.sequence, tuple(e.uid for e in self.events))

    def to_json(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "condition": self.condition.to_json(),
                "events": [e.to_dict() for e in self.events]}

    def to_json_text(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)
