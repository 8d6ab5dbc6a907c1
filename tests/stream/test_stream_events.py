"""Events and the page-level sequence built from the time-level one."""

from __future__ import annotations

import pytest

from edgerun.errors import EdgerunError
from edgerun.stream.events import Event, EventKind, PageSequencer, page_visits


def test_event_defaults_keys_and_round_trip() -> None:
    event = Event("click", "item", 5, event_id="click.add_cart", contents={"item": 1})
    assert event.keys == ("click.add_cart", "item", "click.add_cart@item")
    assert Event("scroll", "home", 1).event_id == "scroll"
    assert Event.from_dict(event.to_dict()) == event
    assert Event("click", "p", 1).uid != Event("click", "p", 1).uid
    with pytest.raises(EdgerunError):
        Event("tap", "p", 1)
    with pytest.raises(EdgerunError):
        Event.from_dict({"kind": "click"})


def test_page_visits_group_events_from_enter_to_exit_and_handle_nesting() -> None:
    e = [Event("page_enter", "home", 0), Event("exposure", "home", 1), Event("page_enter", "item", 2),
         Event("click", "item", 3), Event("page_enter", "dialog", 4),  # a dialog left without an exit
         Event("page_exit", "item", 5), Event("scroll", "home", 6), Event("page_exit", "home", 7),
         Event("click", "nowhere", 8)]
    visits = list(page_visits(e))
    assert [(v.page_id, [x.time_ms for x in v.events], v.dwell_ms) for v in visits] == [
        ("dialog", [4], None), ("item", [2, 3, 5], 3), ("home", [0, 1, 6, 7], 7)]
    sequencer = PageSequencer()
    sequencer.add(Event(EventKind.PAGE_ENTER, "a", 0))
    assert [v.page_id for v in sequencer.open_visits] == ["a"]
