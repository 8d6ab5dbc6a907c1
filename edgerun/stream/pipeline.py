"""DevicePipeline: what the device agent owns. Events in from the durable queue, trigger matching, task
outputs into collective storage, and uploads through the tunnel. One thread drives it (`pump`, `upload`:
the agent's hooks thread); tasks are registered and unregistered from another (the agent loop's check-in),
so the trigger trie and the handlers are read and changed under a lock, never held while a task runs.

`max_concurrent_runs` > 1 runs the tasks one event matched side by side (Walle runs matched tasks
concurrently; the agent's warm pool bounds them too); their outputs are stored in match order all the same.
`realtime` sends a batch through the tunnel as soon as a pump stored outputs, instead of waiting for the
agent's next `upload()`; delivery is the same code path, so it stays exactly-once.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from edgerun.stream.event_queue import EventEmitter, EventQueue
from edgerun.stream.events import Event, EventKind, PageSequencer, PageVisit
from edgerun.stream.storage import DROP_OLDEST, CollectiveStore
from edgerun.stream.trie import TriggerTrie
from edgerun.stream.trigger_spec import CAPTURE_PAGE, CAPTURE_SPAN, TriggerMatch, parse_triggers
from edgerun.stream.uploader import Backoff, Uploader
from edgerun.stream.wire import MAX_BATCH_BYTES

log = logging.getLogger(__name__)

OnMatch = Callable[[TriggerMatch], dict[str, Any] | None]
OUTPUTS_FILE = "outputs.db"
RECENT_EVENTS = 4096  # the time-level sequence kept in memory for `capture: span` and for replay


class DevicePipeline:
    def __init__(self, state_dir: str | Path, upload_url: str | None = None, device_id: str = "device",
                 token: str | Callable[[], str] | None = None, *, flush_threshold: int = 32, max_pending: int = 50_000,
                 drop_policy: str = DROP_OLDEST, batch_records: int = 200, backoff: Backoff | None = None,
                 pump_batch: int = 1000, max_concurrent_runs: int = 1, realtime: bool = False,
                 max_batch_bytes: int = MAX_BATCH_BYTES, part_bytes: int = 8 * 1024 * 1024) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.device_id = device_id
        self.queue = EventQueue(self.state_dir)
        self._emitter: EventEmitter | None = None
        self.store = CollectiveStore(self.state_dir / OUTPUTS_FILE, flush_threshold=flush_threshold,
                                     max_pending=max_pending, drop_policy=drop_policy)
        self.uploader = (Uploader(self.store, upload_url, device_id, token, batch_records=batch_records,
                                  backoff=backoff, max_batch_bytes=max_batch_bytes, part_bytes=part_bytes)
                         if upload_url else None)
        self.trie = TriggerTrie()
        self._handlers: dict[str, OnMatch] = {}
        self._tasks_lock = threading.Lock()  # the trie and the handlers: see the module docstring
        self.stopping = threading.Event()  # set: pump ends after the event in hand, leaving the rest queued
        self._recent: deque[Event] = deque(maxlen=RECENT_EVENTS)  # the time-level sequence
        self._pages = PageSequencer()  # the page-level sequence
        self._closed_now: list[PageVisit] = []  # visits the event being processed closed
        self._replayed = False
        self.pump_batch = pump_batch
        self.realtime = realtime
        self._executor = ThreadPoolExecutor(max_concurrent_runs, "pipeline-run") if max_concurrent_runs > 1 else None
        self.stats: dict[str, int] = {"events_processed": 0, "matches": 0, "task_errors": 0}

    # -- tasks ---------------------------------------------------------------------------------------------

    def register_task(self, task_id: str, triggers: Any, on_match: OnMatch) -> None:
        """Registers a task's `triggers` (format: docs/stream.md); `on_match` runs it and may return its output."""
        parsed = parse_triggers(triggers)
        with self._tasks_lock:
            self.trie.add_task(task_id, parsed)
            self._handlers[task_id] = on_match

    def unregister_task(self, task_id: str) -> None:
        with self._tasks_lock:
            self.trie.remove_task(task_id)
            self._handlers.pop(task_id, None)

    # -- events --------------------------------------------------------------------------------------------

    def emit(self, kind: EventKind | str | Event, page_id: str | None = None, **fields: Any) -> Event:
        """In-process emit, through the same durable queue the app uses; processed on the next pump()."""
        if self._emitter is None:
            self._emitter = EventEmitter(self.state_dir)
        if isinstance(kind, Event):
            self._emitter.emit_events([kind])
            return kind
        if page_id is None:
            raise TypeError("emit() needs a page_id")
        return self._emitter.emit(kind, page_id, **fields)

    def pump(self, max_events: int | None = None) -> int:
        """Processes queued events: match, run matched tasks, store outputs, then commit the queue cursor.
        Once `stopping` is set, the event in hand (whose runs the stop cancelled) and those after it stay
        queued: the next start runs them."""
        if not self._replayed:
            self._replay_tail()
        limit = max_events or self.pump_batch
        total = 0
        while not self.stopping.is_set():
            batch = self.queue.read(min(limit - total, self.pump_batch))
            if not batch:
                break
            done = 0
            for _, event in batch:
                if event is not None:  # (a malformed one is counted by the queue as events_malformed)
                    outputs = self._process(event)
                    if self.stopping.is_set():
                        break
                    for match, output in outputs:
                        if output is not None:
                            self.store.put(match.task_id, output, record_id=match.record_id)
                done += 1
            # Outputs first, cursor second: a crash in between re-runs the events, and the idempotent record
            # ids make the re-run store nothing twice.
            stored = self.store.flush()
            if done:
                self.queue.commit(batch[done - 1][0])
            if self.realtime and stored:
                self.upload()
            total += done
            self.stats["events_processed"] += done
            if total >= limit:
                break
        return total

    def _process(self, event: Event) -> list[tuple[TriggerMatch, dict[str, Any] | None]]:
        """One event: its matches (under the tasks lock) and the outputs of the tasks they ran (outside it)."""
        with self._tasks_lock:
            self._observe(event)
            matched = [(m, self._handlers.get(m.task_id)) for m in map(self._prepare, self.trie.match(event))]
        calls = [(m, h) for m, h in matched if h is not None]
        self.stats["matches"] += len(calls)
        if self._executor is not None and len(calls) > 1:
            self.store.flush()  # what the tasks may read is written before they start, on this thread
            outputs = list(self._executor.map(lambda call: self._call(*call), calls))
        else:
            outputs = [self._call(m, h) for m, h in calls]
        return [(m, out) for (m, _), out in zip(calls, outputs, strict=True)]

    def _replay_tail(self) -> None:
        """Rebuilds partial matches after a restart from the events consumed before it, without firing."""
        self._replayed = True
        for event in self.queue.consumed_tail(RECENT_EVENTS):
            with self._tasks_lock:
                self._observe(event)
                self.trie.match(event, fire=False)

    def _observe(self, event: Event) -> None:
        self._recent.append(event)
        self._closed_now = self._pages.add(event)

    def _prepare(self, match: TriggerMatch) -> TriggerMatch:
        """The match with the events its condition captures (read from the sequences, on this thread)."""
        if match.condition.capture == CAPTURE_SPAN:
            return match._replace(events=self._span(match.events))
        if match.condition.capture == CAPTURE_PAGE:
            return match._replace(events=self._page_visit(match.events[-1]))
        return match

    def _call(self, match: TriggerMatch, handler: OnMatch) -> dict[str, Any] | None:
        try:
            return handler(match)
        except Exception:  # a task's fault must not stop the pipeline or the other tasks
            self.stats["task_errors"] += 1  # (a lost increment under concurrency only skews a counter)
            log.exception("task %s failed on a trigger match", match.task_id)
            return None

    def _span(self, matched: tuple[Event, ...]) -> tuple[Event, ...]:
        first, last = matched[0].uid, matched[-1].uid
        span: list[Event] = []
        for event in reversed(self._recent):
            if span or event.uid == last:
                span.append(event)
            if span and event.uid == first:
                return tuple(reversed(span))
        return matched  # the span is longer than the kept sequence: hand over what was matched

    def _page_visit(self, last: Event) -> tuple[Event, ...]:
        """The page visit the last matched event closed (a page exit) or is part of (still open)."""
        for visit in self._closed_now:
            if visit.exit is last:
                return tuple(visit.events)
        for visit in reversed(self._pages.open_visits):
            if visit.page_id == last.page_id:
                return tuple(visit.events)
        return (last,)  # the app never sent this page's enter

    # -- outputs and upload --------------------------------------------------------------------------------

    def store_output(self, task_id: str, record: dict[str, Any], record_id: str | None = None) -> str:
        return self.store.put(task_id, record, record_id=record_id)

    def upload(self) -> int:
        """Sends what is ready without blocking (honours backoff); returns records acknowledged."""
        return self.uploader.upload_ready() if self.uploader else 0

    def flush(self, timeout_s: float = 30.0) -> int:
        """Processes every queued event, writes buffered outputs and uploads everything (blocking)."""
        while self.pump():
            pass
        self.store.flush()
        return self.uploader.upload_all(timeout_s) if self.uploader else 0

    def counters(self) -> dict[str, int]:
        return {**self.stats, **self.store.counters(),
                **{f"queue_{k}": v for k, v in self.queue.stats().items()}}

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self.store.close()
        self.queue.close()
        if self._emitter is not None:
            self._emitter.close()
        if self.uploader is not None:
            self.uploader.close()
