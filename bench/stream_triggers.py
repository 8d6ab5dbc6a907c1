"""Trigger matching throughput: the trie against a naive scan of every condition (docs/benchmarks.md).

Synthetic app: 200 pages and 2,000 click targets, both drawn Zipf-like (a few hot pages and buttons, a long
tail); events arrive in page visits (enter, a run of clicks, scrolls and exposures, exit). Conditions of
length 2..6 name page enters/exits, clicks, pages and page scrolls drawn with the same skew, half strict and
half relaxed (see make_conditions). Trie and naive scan must produce identical matches.

    .venv/bin/python bench/stream_triggers.py [--conditions 1000] [--events 200000] [--repeats 5]

Last line: `events_per_s=<N> speedup_vs_naive=<M>`.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import time
from pathlib import Path

from edgerun.stream.events import Event, EventKind
from edgerun.stream.naive_matcher import NaiveMatcher
from edgerun.stream.trie import TriggerTrie
from edgerun.stream.trigger_spec import RELAXED, STRICT, TriggerCondition

N_PAGES = 200
N_CLICK_IDS = 2000


def zipf_weights(n: int, s: float = 1.0) -> list[float]:
    return [1.0 / (rank ** s) for rank in range(1, n + 1)]


def make_events(count: int, rng: random.Random) -> list[Event]:
    """Page visits: enter, then clicks (20%), scrolls (35%) and exposures (45%), then exit."""
    pages = [f"page{i}" for i in range(N_PAGES)]
    clicks = [f"click{i}" for i in range(N_CLICK_IDS)]
    page_w, click_w = zipf_weights(N_PAGES), zipf_weights(N_CLICK_IDS)
    events: list[Event] = []
    t = 1_700_000_000_000
    while len(events) < count:
        page = rng.choices(pages, page_w)[0]
        t += rng.randint(50, 2000)
        events.append(Event(EventKind.PAGE_ENTER, page, t))
        for _ in range(rng.randint(3, 30)):
            t += rng.randint(20, 3000)
            roll = rng.random()
            if roll < 0.2:
                events.append(Event(EventKind.CLICK, page, t, event_id=rng.choices(clicks, click_w)[0]))
            elif roll < 0.55:
                events.append(Event(EventKind.SCROLL, page, t))
            else:
                events.append(Event(EventKind.EXPOSURE, page, t, contents={"item": rng.randrange(10**6)}))
        t += rng.randint(20, 1000)
        events.append(Event(EventKind.PAGE_EXIT, page, t))
    return events[:count]


def make_conditions(count: int, rng: random.Random, skew: float = 1.0) -> list[TriggerCondition]:
    """Steps name what tasks care about: entering or leaving a page (40%), a click (40%), being on a page
    (10%), scrolling a page (10%); pages and clicks drawn with the same Zipf skew as the events."""
    pages = [f"page{i}" for i in range(N_PAGES)]
    clicks = [f"click{i}" for i in range(N_CLICK_IDS)]
    # `skew` above 1 piles the conditions onto the hottest pages and clicks: the hard case for any matcher.
    page_w, click_w = zipf_weights(N_PAGES, skew), zipf_weights(N_CLICK_IDS, skew)
    conditions = []
    for _ in range(count):
        steps = []
        for _ in range(rng.randint(2, 6)):
            roll = rng.random()
            page = rng.choices(pages, page_w)[0]
            if roll < 0.4:
                steps.append(f"{rng.choice(['page_enter', 'page_exit'])}@{page}")
            elif roll < 0.8:
                steps.append(rng.choices(clicks, click_w)[0])
            elif roll < 0.9:
                steps.append(page)
            else:
                steps.append(f"scroll@{page}")
        conditions.append(TriggerCondition(tuple(steps), rng.choice([STRICT, RELAXED]),
                                           rng.choice([None, 60_000, 600_000])))
    return conditions


def run(matcher: TriggerTrie | NaiveMatcher, events: list[Event]) -> tuple[float, float, int]:
    """CPU seconds, wall seconds, matches. CPU time of this single-threaded process is time on one core,
    and stays meaningful on a machine shared with other work; wall time is reported beside it."""
    match = matcher.match
    fired = 0
    start_cpu, start_wall = time.process_time(), time.perf_counter()
    for event in events:
        fired += len(match(event))
    return time.process_time() - start_cpu, time.perf_counter() - start_wall, fired


def build(kind: type[TriggerTrie] | type[NaiveMatcher], conditions: list[TriggerCondition]) -> TriggerTrie | NaiveMatcher:
    matcher = kind()
    for i, condition in enumerate(conditions):
        matcher.add_task(f"task{i}", [condition])
    return matcher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conditions", type=int, default=1000)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--naive-events", type=int, default=5_000, help="the naive scan is slow: fewer events")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--condition-skew", type=float, default=1.0,
                        help="Zipf exponent of the ids in conditions (events use 1.0)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/stream_triggers.json"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    conditions = make_conditions(args.conditions, rng, args.condition_skew)
    events = make_events(args.events, rng)

    # Same matches on a prefix of the stream, or the comparison means nothing.
    check = events[: args.naive_events]
    trie_check, naive_check = build(TriggerTrie, conditions), build(NaiveMatcher, conditions)
    for event in check:
        a = sorted(m.key() for m in trie_check.match(event))
        b = sorted(m.key() for m in naive_check.match(event))
        if a != b:
            raise SystemExit(f"trie and naive scan disagree at {event!r}: {a} != {b}")

    trie_rates, naive_rates, trie_wall, naive_wall, fired_per_event = [], [], [], [], 0.0
    for _ in range(args.repeats):
        cpu, wall, fired = run(build(TriggerTrie, conditions), events)
        trie_rates.append(len(events) / cpu)
        trie_wall.append(len(events) / wall)
        fired_per_event = fired / len(events)
        cpu, wall, _ = run(build(NaiveMatcher, conditions), events[: args.naive_events])
        naive_rates.append(args.naive_events / cpu)
        naive_wall.append(args.naive_events / wall)
    trie_rate, naive_rate = statistics.median(trie_rates), statistics.median(naive_rates)
    speedup = trie_rate / naive_rate
    trie = build(TriggerTrie, conditions)
    assert isinstance(trie, TriggerTrie)
    print(f"conditions={args.conditions} (length 2-6, half strict, skew {args.condition_skew}) "
          f"trie_nodes={trie.node_count} "
          f"events={args.events} matches_per_event={fired_per_event:.3f}")
    print(f"{'matcher':<12}{'events/s, CPU (median)':>24}{'min':>12}{'max':>12}{'events/s, wall (median)':>26}")
    print(f"{'trie':<12}{trie_rate:>24,.0f}{min(trie_rates):>12,.0f}{max(trie_rates):>12,.0f}"
          f"{statistics.median(trie_wall):>26,.0f}")
    print(f"{'naive scan':<12}{naive_rate:>24,.0f}{min(naive_rates):>12,.0f}{max(naive_rates):>12,.0f}"
          f"{statistics.median(naive_wall):>26,.0f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "conditions": args.conditions, "condition_skew": args.condition_skew, "events": args.events, "naive_events": args.naive_events,
        "repeats": args.repeats, "trie_nodes": trie.node_count, "matches_per_event": fired_per_event,
        "trie_events_per_s_cpu": trie_rates, "naive_events_per_s_cpu": naive_rates,
        "trie_events_per_s_wall": trie_wall, "naive_events_per_s_wall": naive_wall,
        "median_trie_events_per_s": trie_rate, "median_naive_events_per_s": naive_rate, "speedup": speedup,
        "python": platform.python_version(), "machine": platform.processor() or platform.machine(),
    }, indent=2))
    print(f"events_per_s={trie_rate:.0f} speedup_vs_naive={speedup:.1f}")


if __name__ == "__main__":
    main()
