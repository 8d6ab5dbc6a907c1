"""The stream functions a task script uses on its events (Walle §5.1): Filter, Map, KeyBy, TimeWindow.

    EventStream(match.events).filter(lambda e: e.kind == "click").map(lambda e: e.contents["item"]).to_list()
    EventStream(events).key_by(lambda e: e.page_id).window(Tumbling(60_000), grace_ms=5_000).aggregate(len)
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, Generic, TypeVar

from edgerun.stream.events import Event
from edgerun.stream.windows import Assigner, WindowOperator, WindowResult

T = TypeVar("T")
U = TypeVar("U")


def event_time(item: Any) -> int:
    if isinstance(item, Event):
        return item.time_ms
    raise TypeError(f"no event time for {item!r}: pass time_of= to window()")


class EventStream(Generic[T]):
    """A lazy chain over a task's events (or any items); iterating it runs the chain once."""

    def __init__(self, items: Iterable[T]) -> None:
        self._items = items

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)

    def filter(self, predicate: Callable[[T], bool]) -> EventStream[T]:
        return EventStream(item for item in self._items if predicate(item))

    def map(self, function: Callable[[T], U]) -> EventStream[U]:
        return EventStream(function(item) for item in self._items)

    def key_by(self, key: Callable[[T], Hashable]) -> KeyedStream[T]:
        return KeyedStream(self._items, key)

    def to_list(self) -> list[T]:
        return list(self._items)


class KeyedStream(Generic[T]):
    def __init__(self, items: Iterable[T], key: Callable[[T], Hashable]) -> None:
        self._items = items
        self._key = key

    def groups(self) -> dict[Hashable, list[T]]:
        """Items by key, each list in arrival order."""
        grouped: dict[Hashable, list[T]] = {}
        for item in self._items:
            grouped.setdefault(self._key(item), []).append(item)
        return grouped

    def window(self, assigner: Assigner, *, grace_ms: int = 0,
               time_of: Callable[[T], int] = event_time) -> WindowedStream[T]:
        return WindowedStream(self._items, self._key, assigner, grace_ms, time_of)


class WindowedStream(Generic[T]):
    def __init__(self, items: Iterable[T], key: Callable[[T], Hashable], assigner: Assigner, grace_ms: int,
                 time_of: Callable[[T], int]) -> None:
        self._items, self._key, self._time_of = items, key, time_of
        self.operator = WindowOperator(assigner, grace_ms)

    def aggregate(self, function: Callable[[list[T]], Any] | None = None) -> list[WindowResult]:
        """Every window in the order it closed, with `result = function(values)`; late items are dropped and
        counted in `self.operator.late_dropped`."""
        self.operator.aggregate = function
        results: list[WindowResult] = []
        for item in self._items:
            results.extend(self.operator.add(self._key(item), self._time_of(item), item))
        results.extend(self.operator.flush())
        return results
