"""The trigger trie against the naive per-condition matcher, plus the documented semantics on examples."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgerun.errors import EdgerunError
from edgerun.stream.events import Event
from edgerun.stream.naive_matcher import NaiveMatcher
from edgerun.stream.trie import TriggerTrie
from edgerun.stream.trigger_spec import RELAXED, STRICT, TriggerCondition, parse_triggers

IDS = ["a", "b", "c", "p", "q", "a@p", "b@q"]


def ev(event_id: str, page: str = "p", t: int = 0) -> Event:
    return Event("click", page, t, event_id=event_id)


conditions = st.builds(TriggerCondition, st.lists(st.sampled_from(IDS), min_size=1, max_size=4).map(tuple),
                       st.sampled_from([STRICT, RELAXED]), st.sampled_from([None, 0, 3, 10]))
events = st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.sampled_from(["p", "q"]),
                            st.integers(-4, 8)), max_size=40)


@settings(max_examples=200, deadline=None)
@given(tasks=st.lists(st.lists(conditions, min_size=1, max_size=3), min_size=1, max_size=5), stream=events,
       replayed=st.integers(0, 10))
def test_trie_matches_exactly_what_the_naive_scan_matches(tasks: list[list[TriggerCondition]],
                                                          stream: list[tuple[str, str, int]], replayed: int) -> None:
    trie, naive = TriggerTrie(), NaiveMatcher()
    for i, conds in enumerate(tasks):
        trie.add_task(f"task{i}", conds)
        naive.add_task(f"task{i}", conds)
    t = 0
    for n, (event_id, page, dt) in enumerate(stream):
        t += dt  # event times go backwards sometimes: out-of-order arrival
        event = ev(event_id, page, t)
        fire = n >= replayed  # the first events are a replay after a restart: state only, no firing
        got = trie.match(event, fire=fire)
        assert sorted(m.key() for m in got) == sorted(m.key() for m in naive.match(event, fire=fire))
        assert fire or got == []


def fired(conds: list[TriggerCondition], stream: list[Event]) -> list[tuple[str, ...]]:
    trie = TriggerTrie()
    trie.add_task("t", conds)
    out = []
    for event in stream:
        out.extend(tuple(e.event_id for e in m.events) for m in trie.match(event))
    return out


def test_relaxed_is_the_default_and_skips_unrelated_events() -> None:
    (cond,) = parse_triggers([["a", "b"]])
    assert cond.contiguity == RELAXED
    assert fired([cond], [ev("a"), ev("c"), ev("c"), ev("b")]) == [("a", "b")]


def test_strict_needs_the_very_next_event() -> None:
    strict = TriggerCondition(("a", "b"), STRICT)
    assert fired([strict], [ev("a"), ev("c"), ev("b")]) == []
    assert fired([strict], [ev("a"), ev("b")]) == [("a", "b")]


def test_fires_once_per_prefix_and_again_after_a_new_prefix() -> None:
    cond = TriggerCondition(("a", "b"))
    assert fired([cond], [ev("a"), ev("b"), ev("b")]) == [("a", "b")]
    assert fired([cond], [ev("a"), ev("b"), ev("a"), ev("b")]) == [("a", "b"), ("a", "b")]


def test_newest_prefix_wins_so_within_is_met_when_any_match_meets_it() -> None:
    cond = TriggerCondition(("a", "b"), RELAXED, within_ms=5)
    trie = TriggerTrie()
    trie.add_task("t", [cond])
    for event in [ev("a", t=0), ev("a", t=10)]:
        assert trie.match(event) == []
    (match,) = trie.match(ev("b", t=12))
    assert [e.time_ms for e in match.events] == [10, 12]
    assert trie.match(ev("b", t=30)) == []  # the pending a (t=10) is 20 ms away: outside `within`


def test_one_event_advances_a_condition_by_one_step() -> None:
    # The event's id is "a" and its page is "p": it must not complete [a, p] on its own.
    assert fired([TriggerCondition(("a", "p"))], [ev("a", "p")]) == []
    assert fired([TriggerCondition(("a", "p"))], [ev("a", "p"), ev("c", "p")]) == [("a", "c")]


def test_qualified_ids_need_event_and_page() -> None:
    cond = TriggerCondition(("page_exit@item",))
    trie = TriggerTrie()
    trie.add_task("t", [cond])
    assert trie.match(Event("page_exit", "home", 1)) == []
    assert len(trie.match(Event("page_exit", "item", 2))) == 1


def test_shared_prefixes_share_nodes_and_removal_keeps_other_tasks() -> None:
    trie = TriggerTrie()
    trie.add_task("x", [TriggerCondition(("a", "b", "c"))])
    nodes = trie.node_count
    trie.add_task("y", [TriggerCondition(("a", "b", "d"))])
    assert trie.node_count == nodes + 1
    trie.remove_task("x")
    assert trie.task_ids == ["y"]
    assert [m.task_id for e in [ev("a"), ev("b"), ev("c"), ev("d")] for m in trie.match(e)] == ["y"]


@pytest.mark.parametrize("bad", [[], "a", [[]], [{"sequence": ["a"], "contiguity": "loose"}],
                                 [{"sequence": ["a"], "within_s": -1}], [{"sequence": ["a"], "colour": 1}],
                                 [{"sequence": [1]}], [{"sequence": ["a"], "capture": "all"}]])
def test_malformed_triggers_are_user_errors(bad: object) -> None:
    with pytest.raises(EdgerunError):
        parse_triggers(bad)


def test_trigger_format_round_trips() -> None:
    conds = parse_triggers([{"sequence": ["a", "b"], "contiguity": "strict", "within_s": 2.5, "capture": "span"},
                            ["c"]])
    assert conds[0] == TriggerCondition(("a", "b"), STRICT, 2500, "span")
    assert parse_triggers([c.to_json() for c in conds]) == conds


def test_the_first_completion_after_a_prefix_decides() -> None:
    cond = TriggerCondition(("a", "b"), RELAXED, within_ms=50)
    # b at t=100 is the first completion of the prefix a(t=0) and is outside `within`; a late b at t=10
    # does not reopen that prefix. A new a does.
    assert fired([cond], [ev("a", t=0), ev("b", t=100), ev("b", t=10)]) == []
    assert fired([cond], [ev("a", t=0), ev("b", t=100), ev("a", t=90), ev("b", t=110)]) == [("a", "b")]


def test_a_longer_relaxed_condition_uses_the_newest_start_and_the_first_step_after_it() -> None:
    cond = TriggerCondition(("a", "b", "c"))
    trie = TriggerTrie()
    trie.add_task("t", [cond])
    stream = [ev("a", t=1), ev("b", t=2), ev("a", t=3), ev("b", t=4), ev("b", t=5), ev("c", t=6)]
    matches = [m for e in stream for m in trie.match(e)]
    assert [[e.time_ms for e in m.events] for m in matches] == [[3, 4, 6]]
