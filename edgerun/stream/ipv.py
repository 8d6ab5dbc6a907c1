"""The paper's item-page-visit (IPV) feature (Walle §7.1), computed on the device from raw events.

Trigger: the exit of the item detail page; `capture: page` hands the task that page visit from the
page-level sequence (its enter, everything on the page, its exit). The task filters out the redundant fields (device status and the like), clusters the
events by kind and action, and keeps the statistics the recommendation models use. The synthetic generator
makes app sessions whose raw events carry the bulky fields real trackers attach to every event.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

from edgerun.stream.events import Event, EventKind
from edgerun.stream.operators import EventStream

ITEM_PAGE = "item_detail"
# As in the paper: triggered by the exit of the item page, with the page's visit (enter..exit) as input.
IPV_TRIGGER: dict[str, Any] = {"sequence": [f"page_exit@{ITEM_PAGE}"], "capture": "page"}
# The same visit found as a two-step condition and the span between its steps.
IPV_TRIGGER_SPAN: dict[str, Any] = {"sequence": [f"page_enter@{ITEM_PAGE}", f"page_exit@{ITEM_PAGE}"],
                                    "within_s": 3600, "capture": "span"}
ACTIONS = ("add_favorite", "add_cart", "purchase", "share", "view_comments", "view_sku", "view_image",
           "follow_shop", "ask_question")
OTHER_PAGES = ("home", "search", "cart", "shop", "messages")


def ipv_feature(events: tuple[Event, ...] | list[Event]) -> dict[str, Any]:
    """The IPV feature of one visit (its events from page enter to page exit, in arrival order)."""
    enter, exit_ = events[0], events[-1]
    on_page = EventStream(events).filter(lambda e: e.page_id == ITEM_PAGE)
    kinds = Counter(e.kind.value for e in on_page)
    clicks = EventStream(events).filter(lambda e: e.kind is EventKind.CLICK).map(lambda e: e.event_id).to_list()
    action_counts = Counter(c.removeprefix("click.") for c in clicks)
    scrolls = EventStream(events).filter(lambda e: e.kind is EventKind.SCROLL)
    exposures = (EventStream(events).filter(lambda e: e.kind is EventKind.EXPOSURE)
                 .map(lambda e: e.contents.get("exposed_item")).filter(lambda item: item is not None).to_list())
    first_action_ms: dict[str, int] = {}
    for event in events:
        if event.kind is EventKind.CLICK:
            first_action_ms.setdefault(event.event_id.removeprefix("click."), event.time_ms - enter.time_ms)
    return {
        "item_id": enter.contents.get("item_id"),
        "shop_id": enter.contents.get("shop_id"),
        "category_id": enter.contents.get("category_id"),
        "price_cents": enter.contents.get("price_cents"),
        "source_page": enter.contents.get("source_page"),
        "enter_ms": enter.time_ms,
        "dwell_ms": exit_.time_ms - enter.time_ms,
        "events": len(events),
        "kind_counts": dict(sorted(kinds.items())),
        "actions": {a: action_counts[a] for a in ACTIONS if action_counts[a]},
        "first_action_ms": dict(sorted(first_action_ms.items())),
        "max_scroll_depth": max((e.contents.get("depth", 0) for e in scrolls), default=0),
        "exposed_items": exposures[:20],
        "images_viewed": sorted({e.contents["image_index"] for e in events if "image_index" in e.contents}),
    }


def _device_status(rng: random.Random) -> dict[str, Any]:
    """What a tracker attaches to every event and the IPV feature does not need."""
    return {
        "battery": rng.randint(5, 100), "charging": rng.random() < 0.2, "network": rng.choice(["wifi", "4g", "5g"]),
        "signal_dbm": -rng.randint(50, 110), "os": "android 13", "os_build": "TP1A.220624.014",
        "app_version": "10.28.10", "app_build": 4_310_228, "device_model": "Pixel 7", "screen": "1080x2400",
        "dpi": 420, "locale": "zh_CN", "timezone": "Asia/Shanghai", "memory_free_mb": rng.randint(200, 3000),
        "cpu_load": round(rng.random(), 3), "lat": round(30.2 + rng.random(), 6), "lon": round(120.1 + rng.random(), 6),
        "carrier": "China Mobile", "utdid": "WqbS1lRBBuADAJ3eWvyUDq9x", "imsi_hash": "9d3f1c2a8b7e6d5c",
        "session_id": "s-7f3a9c21e4b84d7a9c1e2f3a4b5c6d7e", "trace_id": f"{rng.getrandbits(128):032x}",
        "spm_url": "a2141.7631564.recommend.item_card.0", "scm": "1007.13029.131809.100200300000000",
        "ab_buckets": "b117:3,b204:1,b391:7,b455:2,b602:0,b733:5,b810:4,b922:1",
        "sdk": {"name": "ut-analytics", "version": "6.5.4.32", "channel": "taobao_default"},
        "page_stack": ["home", "search", "item_detail"][: rng.randint(1, 3)],
    }


def generate_session(rng: random.Random, start_ms: int, visits: int) -> list[Event]:
    """A user's events: item page visits between visits to other pages."""
    events: list[Event] = []
    t = start_ms

    def add(kind: EventKind, page: str, event_id: str | None = None, **contents: Any) -> None:
        nonlocal t
        t += rng.randint(150, 4000)
        events.append(Event(kind, page, t, event_id=event_id, contents={**contents, "device": _device_status(rng)}))

    for _ in range(visits):
        other = rng.choice(OTHER_PAGES)
        add(EventKind.PAGE_ENTER, other)
        for _ in range(rng.randint(1, 4)):
            add(EventKind.EXPOSURE, other, exposed_item=rng.randrange(10**9))
        add(EventKind.PAGE_EXIT, other)
        item = rng.randrange(10**9)
        add(EventKind.PAGE_ENTER, ITEM_PAGE, item_id=item, shop_id=rng.randrange(10**7),
            category_id=rng.randrange(10**4), price_cents=rng.randint(100, 10**6), source_page=other)
        # About 19 events per visit on average, as in the paper (19.3 raw events per IPV feature).
        for _ in range(rng.randint(6, 28)):
            roll = rng.random()
            if roll < 0.35:
                add(EventKind.SCROLL, ITEM_PAGE, depth=rng.randint(1, 100))
            elif roll < 0.7:
                add(EventKind.EXPOSURE, ITEM_PAGE, exposed_item=rng.randrange(10**9))
            else:
                action = rng.choice(ACTIONS)
                extra = {"image_index": rng.randint(0, 8)} if action == "view_image" else {}
                add(EventKind.CLICK, ITEM_PAGE, f"click.{action}", **extra)
        add(EventKind.PAGE_EXIT, ITEM_PAGE, item_id=item)
    return events


def cloud_join_ipv(events: list[Event]) -> list[dict[str, Any]]:
    """The cloud baseline's way: split the raw stream by kind and join them back on (page, time range).

    Kept as a check of the device's result: both must produce the same features."""
    enters = [e for e in events if e.kind is EventKind.PAGE_ENTER and e.page_id == ITEM_PAGE]
    exits = [e for e in events if e.kind is EventKind.PAGE_EXIT and e.page_id == ITEM_PAGE]
    features = []
    for enter in enters:
        exit_ = min((x for x in exits if x.time_ms > enter.time_ms), key=lambda x: x.time_ms)
        visit = [e for e in events if enter.time_ms <= e.time_ms <= exit_.time_ms]
        features.append(ipv_feature(visit))
    return features
