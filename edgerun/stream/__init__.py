"""The on-device stream pipeline (Walle §5): events, trigger trie, operators and windows, collective storage
in SQLite, and the tunnel to the cloud. Design and formats: docs/stream.md.

The cloud end (`edgerun.stream.cloud`, FastAPI) is not imported here: devices do not need it.
"""

from __future__ import annotations

from edgerun.stream.event_queue import EventEmitter, EventQueue
from edgerun.stream.events import Event, EventKind, PageSequencer, PageVisit, page_visits
from edgerun.stream.operators import EventStream
from edgerun.stream.pipeline import DevicePipeline
from edgerun.stream.storage import CollectiveStore, read_outputs
from edgerun.stream.trie import TriggerTrie
from edgerun.stream.trigger_spec import TriggerCondition, TriggerMatch, parse_triggers
from edgerun.stream.windows import Session, Sliding, Tumbling, WindowOperator

__all__ = [
    "CollectiveStore", "DevicePipeline", "Event", "EventEmitter", "EventKind", "EventQueue", "EventStream",
    "PageSequencer", "PageVisit", "Session", "Sliding", "TriggerCondition", "TriggerMatch", "TriggerTrie",
    "Tumbling", "WindowOperator", "page_visits", "parse_triggers", "read_outputs",
]
