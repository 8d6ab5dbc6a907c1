"""Event-time windows: tumbling, sliding and session, with a grace period for late and out-of-order events.

Watermark = the largest event time seen so far minus `grace_ms`. An event older than the watermark when it
arrives is late: dropped and counted. A window [start, end) closes, and is emitted exactly once, when the
watermark reaches its end; flush() emits what is still open. Accepted events therefore never land in a
closed window, and a session never merges with a closed one (a closed session ends at or before the
watermark, so any accepted event is at least `gap_ms` after its last event).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from edgerun.errors import EdgerunError


@dataclass(frozen=True)
class Tumbling:
    size_ms: int

    def __post_init__(self) -> None:
        if self.size_ms <= 0:
            raise EdgerunError("a tumbling window needs size_ms > 0")

    def starts(self, t: int) -> list[int]:
        return [t - t % self.size_ms]


@dataclass(frozen=True)
class Sliding:
    """Windows of `size_ms` starting every `slide_ms` (at multiples of the slide); an event is in each
    window that covers it."""

    size_ms: int
    slide_ms: int

    def __post_init__(self) -> None:
        if self.size_ms <= 0 or self.slide_ms <= 0:
            raise EdgerunError("a sliding window needs size_ms > 0 and slide_ms > 0")

    def starts(self, t: int) -> list[int]:
        last = t - t % self.slide_ms
        first = last - ((self.size_ms - 1) // self.slide_ms) * self.slide_ms
        return [s for s in range(first, last + 1, self.slide_ms) if s <= t < s + self.size_ms]


@dataclass(frozen=True)
class Session:
    """Events of a key less than `gap_ms` apart share a session; it ends `gap_ms` after its last event."""

    gap_ms: int

    def __post_init__(self) -> None:
        if self.gap_ms <= 0:
            raise EdgerunError("a session window needs gap_ms > 0")


Assigner = Tumbling | Sliding | Session


@dataclass
class WindowResult:
    key: Hashable
    start: int
    end: int
    values: list[Any]
    result: Any = None


@dataclass
class _OpenSession:
    start: int
    last: int
    values: list[Any] = field(default_factory=list)


class WindowOperator:
    """Incremental windowing for long-lived tasks: add() returns the windows the new watermark closed."""

    def __init__(self, assigner: Assigner, grace_ms: int = 0,
                 aggregate: Callable[[list[Any]], Any] | None = None) -> None:
        if grace_ms < 0:
            raise EdgerunError("grace_ms must be >= 0")
        self.assigner = assigner
        self.grace_ms = grace_ms
        self.aggregate = aggregate
        self.max_time: int | None = None
        self.late_dropped = 0
        self._fixed: dict[tuple[Hashable, int], list[Any]] = {}  # tumbling and sliding windows by (key, start)
        self._closing: list[tuple[int, int, int]] = []  # heap of (end, arrival number, start) ...
        self._closing_keys: dict[int, Hashable] = {}  # ... the arrival number names the key (keys may not sort)
        self._arrivals = 0
        self._sessions: dict[Hashable, list[_OpenSession]] = {}

    @property
    def watermark(self) -> int | None:
        return None if self.max_time is None else self.max_time - self.grace_ms

    def add(self, key: Hashable, time_ms: int, value: Any) -> list[WindowResult]:
        watermark = self.watermark
        if watermark is not None and time_ms < watermark:
            self.late_dropped += 1
            return []
        if isinstance(self.assigner, Session):
            self._add_to_session(key, time_ms, value)
        else:
            size = self.assigner.size_ms
            for start in self.assigner.starts(time_ms):
                values = self._fixed.get((key, start))
                if values is None:
                    values = self._fixed[(key, start)] = []
                    self._arrivals += 1
                    self._closing_keys[self._arrivals] = key
                    heapq.heappush(self._closing, (start + size, self._arrivals, start))
                values.append(value)
        if self.max_time is None or time_ms > self.max_time:
            self.max_time = time_ms
        return self._close(self.max_time - self.grace_ms)

    def _add_to_session(self, key: Hashable, t: int, value: Any) -> None:
        gap = self.assigner.gap_ms  # type: ignore[union-attr]
        sessions = self._sessions.setdefault(key, [])
        merged = _OpenSession(t, t, [])
        keep = []
        for session in sessions:
            if session.start < t + gap and t < session.last + gap:
                merged.start = min(merged.start, session.start)
                merged.last = max(merged.last, session.last)
                merged.values.extend(session.values)
            else:
                keep.append(session)
        merged.values.append(value)
        keep.append(merged)
        self._sessions[key] = keep

    def _close(self, watermark: int | None) -> list[WindowResult]:
        closed: list[WindowResult] = []
        while self._closing and (watermark is None or self._closing[0][0] <= watermark):
            end, arrival, start = heapq.heappop(self._closing)
            key = self._closing_keys.pop(arrival)
            closed.append(self._result(key, start, end, self._fixed.pop((key, start))))
        for key, sessions in list(self._sessions.items()):
            done = [s for s in sessions if watermark is None or s.last + self.assigner.gap_ms <= watermark]  # type: ignore[union-attr]
            if not done:
                continue
            self._sessions[key] = [s for s in sessions if s not in done]
            if not self._sessions[key]:
                del self._sessions[key]
            closed.extend(self._result(key, s.start, s.last + self.assigner.gap_ms, s.values)  # type: ignore[union-attr]
                          for s in done)
        closed.sort(key=lambda w: (w.end, w.start))
        return closed

    def _result(self, key: Hashable, start: int, end: int, values: list[Any]) -> WindowResult:
        return WindowResult(key, start, end, values, self.aggregate(values) if self.aggregate else None)

    def flush(self) -> list[WindowResult]:
        """Emits every open window (end of the stream, or the task is stopping)."""
        return self._close(None)
