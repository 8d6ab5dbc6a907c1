"""Windows against a brute-force reference, with late and out-of-order events.

The reference reads the rule of docs/stream.md literally: an event is accepted iff its time is not below
(largest earlier event time − grace); windows are then computed offline over the accepted events of each
key; a window is emitted after the first event that lifts the watermark to its end, or at flush.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from edgerun.stream.events import Event
from edgerun.stream.operators import EventStream
from edgerun.stream.windows import Session, Sliding, Tumbling, WindowOperator

Arrival = tuple[str, int]  # key, event time


def accepted(arrivals: list[Arrival], grace: int) -> list[bool]:
    flags, top = [], None
    for _, t in arrivals:
        flags.append(top is None or t >= top - grace)
        top = t if top is None else max(top, t)
    return flags


def reference_windows(arrivals: list[Arrival], assigner: Tumbling | Sliding | Session,
                      grace: int) -> dict[tuple[str, int, int], list[int]]:
    ok = accepted(arrivals, grace)
    windows: dict[tuple[str, int, int], list[int]] = {}
    if isinstance(assigner, Session):
        for key in {k for k, _ in arrivals}:
            items = sorted((t, i) for i, (k, t) in enumerate(arrivals) if k == key and ok[i])
            session: list[tuple[int, int]] = []
            for t, i in items:
                if session and t - session[-1][0] >= assigner.gap_ms:
                    windows[(key, session[0][0], session[-1][0] + assigner.gap_ms)] = [j for _, j in session]
                    session = []
                session.append((t, i))
            if session:
                windows[(key, session[0][0], session[-1][0] + assigner.gap_ms)] = [j for _, j in session]
        return windows
    size = assigner.size_ms
    for i, (key, t) in enumerate(arrivals):
        if not ok[i]:
            continue
        # Brute force: every window start near t that covers it.
        step = assigner.size_ms if isinstance(assigner, Tumbling) else assigner.slide_ms
        for start in range(t - size - step, t + 1):
            if start % step == 0 and start <= t < start + size:
                windows.setdefault((key, start, start + size), []).append(i)
    return windows


def emitted_after(arrivals: list[Arrival], end: int, grace: int) -> int | None:
    top = None
    for i, (_, t) in enumerate(arrivals):
        top = t if top is None else max(top, t)
        if top - grace >= end:
            return i
    return None


assigners = st.one_of(st.builds(Tumbling, st.integers(1, 12)),
                      st.builds(Sliding, st.integers(1, 12), st.integers(1, 12)),
                      st.builds(Session, st.integers(1, 8)))
streams = st.lists(st.tuples(st.sampled_from(["k1", "k2"]), st.integers(0, 60)), max_size=40)


@settings(max_examples=300, deadline=None)
@given(assigner=assigners, arrivals=streams, grace=st.integers(0, 15))
def test_windows_match_the_brute_force_reference(assigner: Tumbling | Sliding | Session,
                                                 arrivals: list[Arrival], grace: int) -> None:
    operator = WindowOperator(assigner, grace)
    got: dict[tuple[str, int, int], tuple[list[int], int | None]] = {}
    for i, (key, t) in enumerate(arrivals):
        for window in operator.add(key, t, i):
            assert (window.key, window.start, window.end) not in got, "a window was emitted twice"
            got[(str(window.key), window.start, window.end)] = (sorted(window.values), i)
    for window in operator.flush():
        got[(str(window.key), window.start, window.end)] = (sorted(window.values), None)

    expected = reference_windows(arrivals, assigner, grace)
    assert {w: v for w, (v, _) in got.items()} == {w: sorted(v) for w, v in expected.items()}
    for (_, _, end), (_, when) in got.items():
        assert when == emitted_after(arrivals, end, grace)
    assert operator.late_dropped == accepted(arrivals, grace).count(False)


def test_late_event_within_grace_lands_in_its_window_and_beyond_grace_is_dropped() -> None:
    events = [Event("click", "p", t, event_id="x") for t in (1000, 1500, 2100, 1900, 3500, 1200)]
    windowed = EventStream(events).key_by(lambda e: e.page_id).window(Tumbling(1000), grace_ms=300)
    results = windowed.aggregate(lambda values: sorted(e.time_ms for e in values))
    assert [(w.start, w.result) for w in results] == [(1000, [1000, 1500, 1900]), (2000, [2100]),
                                                      (3000, [3500])]
    assert windowed.operator.late_dropped == 1  # t=1200 arrived when the watermark was 3200


def test_operators_filter_map_key_by() -> None:
    events = [Event("click", page, t, event_id=f"c{t % 3}") for t, page in enumerate(["a", "b", "a", "a", "b"])]
    clicks_by_page = EventStream(events).filter(lambda e: e.event_id != "c0").key_by(lambda e: e.page_id).groups()
    assert {k: [e.time_ms for e in v] for k, v in clicks_by_page.items()} == {"b": [1, 4], "a": [2]}
    assert EventStream(events).map(lambda e: e.time_ms * 2).to_list() == [0, 2, 4, 6, 8]
