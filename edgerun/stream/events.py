"""App events (Walle §5.1: page enter/exit, click, scroll, exposure) and page-level sequences built from them."""

from __future__ import annotations

import enum
import json
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from edgerun.errors import EdgerunError


class EventKind(enum.StrEnum):
    PAGE_ENTER = "page_enter"
    PAGE_EXIT = "page_exit"
    CLICK = "click"
    SCROLL = "scroll"
    EXPOSURE = "exposure"


class Event:
    """One app event. `keys` are the trigger ids it can match, computed once because matching is the hot path."""

    __slots__ = ("contents", "event_id", "keys", "kind", "page_id", "time_ms", "uid")

    def __init__(self, kind: EventKind | str, page_id: str, time_ms: int, *, event_id: str | None = None,
                 uid: str | None = None, contents: dict[str, Any] | None = None) -> None:
        try:
            self.kind = EventKind(kind)
        except ValueError as exc:
            raise EdgerunError(f"unknown event kind {kind!r}; expected one of "
                               f"{', '.join(k.value for k in EventKind)}") from exc
        if not page_id:
            raise EdgerunError("an event needs a page id")
        self.page_id = page_id
        self.time_ms = int(time_ms)
        self.event_id = event_id or self.kind.value
        self.uid = uid or uuid.uuid4().hex
        self.contents: dict[str, Any] = contents or {}
        # The event id, the page id and the qualified "event@page" form; an id equal to the page id appears once.
        if self.event_id == page_id:
            self.keys: tuple[str, ...] = (page_id, f"{page_id}@{page_id}")
        else:
            self.keys = (self.event_id, page_id, f"{self.event_id}@{page_id}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind.value, "event_id": self.event_id, "page_id": self.page_id,
                "time_ms": self.time_ms, "uid": self.uid, "contents": self.contents}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Event:
        try:
            return cls(data["kind"], data["page_id"], data["time_ms"], event_id=data.get("event_id"),
                       uid=data.get("uid"), contents=data.get("contents"))
        except (KeyError, TypeError) as exc:
            raise EdgerunError(f"malformed event {data!r}: {exc}") from exc

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    def __repr__(self) -> str:
        return f"Event({self.kind.value}, {self.event_id!r}@{self.page_id!r}, t={self.time_ms}, uid={self.uid[:8]})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Event) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(self.uid)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class PageVisit:
    """The events of one page from its enter to its exit: one element of the page-level sequence."""

    page_id: str
    enter: Event
    events: list[Event] = field(default_factory=list)
    exit: Event | None = None

    @property
    def dwell_ms(self) -> int | None:
        return None if self.exit is None else self.exit.time_ms - self.enter.time_ms


class PageSequencer:
    """Builds the page-level sequence from the time-level one.

    Pages nest (a dialog over a detail page), so open visits form a stack; an exit closes the innermost open
    visit of its page and any visits opened above it, which were left without an exit.
    """

    def __init__(self) -> None:
        self._open: list[PageVisit] = []

    def add(self, event: Event) -> list[PageVisit]:
        """Feed one event; returns the visits it closed (innermost first)."""
        if event.kind is EventKind.PAGE_ENTER:
            self._open.append(PageVisit(event.page_id, event, [event]))
            return []
        for depth in range(len(self._open) - 1, -1, -1):
            visit = self._open[depth]
            if visit.page_id != event.page_id:
                continue
            visit.events.append(event)
            if event.kind is not EventKind.PAGE_EXIT:
                return []
            visit.exit = event
            closed = self._open[depth:]
            del self._open[depth:]
            return closed[::-1]
        return []  # an event on a page never entered (the app started mid-page): not part of any visit

    @property
    def open_visits(self) -> list[PageVisit]:
        return list(self._open)


def page_visits(events: Iterable[Event]) -> Iterator[PageVisit]:
    """The closed page visits of a time-level sequence, in the order they close."""
    sequencer = PageSequencer()
    for event in events:
        yield from sequencer.add(event)
