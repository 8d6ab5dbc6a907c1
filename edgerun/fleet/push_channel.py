"""Push-then-pull, the push half: one server-sent-event stream per device that says "something changed".

The stream carries no release data, only a nudge; the device then pulls its signed assignment by checking
in as always, so nothing it receives here needs to be trusted. Each server process keeps an index of its open
streams (`StreamIndex`: by device id and by the device's gray-step bucket, with the profile the device last
checked in with) and watches the release table (`ReleaseWatch`). A change is noticed at once when it was
made through this process or announced by PostgreSQL `NOTIFY` (release_notify.py: any replica's commit), and
otherwise by polling every `poll_s`. For each release that changed, only the streams it can concern are
looked at: the device ids it names, its beta devices, or the bucket range of its current (or, after a
rollback, its last) gray step; each is asked in memory, against the cached releases, whether that device is
now out of date, and only those are nudged. So a release change costs the devices it targets, not the
fleet. A comment line every `HEARTBEAT_S` lets both ends notice a dead connection; one timer per process
wakes the streams for it in turn (`ReleaseWatch._heartbeat`). The stream is opened with
the device's own bearer token (GET, no body; the body limits of /v1/devices/ apply to it like to any device
route).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import itertools
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi.concurrency import run_in_threadpool
from prometheus_client import Counter, Gauge

from edgerun.fleet import rollout
from edgerun.fleet.push_client import HEARTBEAT_S
from edgerun.fleet.service import CachedRelease, DeviceIdentity, FleetService
from edgerun.fleet.targeting import BUCKETS, DeviceProfile, device_bucket, step_ranges

log = logging.getLogger("edgerun.fleet.server")
CHECK_S = 0.5  # the poll without NOTIFY (SQLite: processes of one host)
HEARTBEAT_SLOTS = 15  # the heartbeat wakes one slot of the open streams each HEARTBEAT_S / HEARTBEAT_SLOTS
_streams = itertools.count()


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


@dataclass
class OpenStream:
    key: int
    owner: DeviceIdentity
    profile: DeviceProfile   # as the device last checked in (targeting facts from the admin, `trusted_profile`)
    bucket: int
    nudged: asyncio.Event = field(default_factory=asyncio.Event)  # wakes the stream: a change, or a ping's turn
    changed: bool = False  # a release change concerns it (else a wake-up is the heartbeat's)


class StreamIndex:
    """The open streams of this process, by device id and by bucket (a sorted list, so a step's bucket range
    is two binary searches away)."""

    def __init__(self) -> None:
        self.by_device: dict[str, dict[int, OpenStream]] = {}
        self._by_bucket: list[tuple[int, int]] = []  # (bucket, key), sorted
        self._by_key: dict[int, OpenStream] = {}
        self._slots: list[set[int]] = [set() for _ in range(HEARTBEAT_SLOTS)]  # keys, by heartbeat turn

    def __len__(self) -> int:
        return len(self._by_key)

    def open(self, owner: DeviceIdentity, profile: DeviceProfile) -> OpenStream:
        stream = OpenStream(next(_streams), owner, profile, device_bucket(owner.device_id))
        self._by_key[stream.key] = stream
        self.by_device.setdefault(owner.device_id, {})[stream.key] = stream
        bisect.insort(self._by_bucket, (stream.bucket, stream.key))
        self._slots[stream.key % HEARTBEAT_SLOTS].add(stream.key)
        return stream

    def close(self, stream: OpenStream) -> None:
        self._by_key.pop(stream.key, None)
        self._slots[stream.key % HEARTBEAT_SLOTS].discard(stream.key)
        mine = self.by_device.get(stream.owner.device_id, {})
        mine.pop(stream.key, None)
        if not mine:
            self.by_device.pop(stream.owner.device_id, None)
        i = bisect.bisect_left(self._by_bucket, (stream.bucket, stream.key))
        if i < len(self._by_bucket) and self._by_bucket[i] == (stream.bucket, stream.key):
            self._by_bucket.pop(i)

    def checked_in(self, profile: DeviceProfile) -> None:
        """Keep the profile a device just checked in with on its open streams (what it runs changed)."""
        for stream in self.by_device.get(profile.device_id, {}).values():
            stream.profile = profile

    def slot(self, turn: int) -> list[OpenStream]:
        """The open streams whose ping is due at heartbeat `turn`."""
        return [self._by_key[k] for k in self._slots[turn % HEARTBEAT_SLOTS]]

    def ids(self, device_ids: list[str]) -> list[OpenStream]:
        return [s for d in device_ids for s in self.by_device.get(d, {}).values()]

    def in_buckets(self, lo: int, hi: int) -> list[OpenStream]:
        start = bisect.bisect_left(self._by_bucket, (lo, -1))
        end = bisect.bisect_left(self._by_bucket, (hi, -1))
        return [self._by_key[k] for _, k in self._by_bucket[start:end]]


def concerned(index: StreamIndex, old: CachedRelease | None, new: CachedRelease | None) -> list[OpenStream]:
    """The open streams a change of one release can concern: those it names, its beta devices, and those in
    the bucket range it covers now (or, after a rollback, covered before; the pre-signed rollback goes to
    them)."""
    release = new or old
    assert release is not None
    if new is None:
        return []  # gone from what any device is offered (terminal and never exposed)
    out = index.ids(list(release.beta))
    if release.targeting.get("kind") == "device":
        return out + index.ids(list(release.targeting.get("values", ())))
    exposure = new.exposure
    if new.stage in rollout.TERMINAL:
        exposure = old.exposure if old is not None and old.exposure > 0 else 100.0
    for lo, hi in step_ranges(release.offset, exposure) if exposure < 100.0 else [(0, BUCKETS)]:
        out += index.in_buckets(lo, hi)
    return out


def _state(release: CachedRelease | None) -> tuple[Any, ...] | None:
    """What decides which devices a release is offered to (its envelopes never change)."""
    return None if release is None else (release.version, release.stage, release.exposure, release.exposed)


def _removes(release: CachedRelease | None) -> bool:
    """Whether `release` now offers the devices it reached its rollback, and that rollback removes the task
    (a task's first release rolled back: there is nothing to return to). A stream's profile is the device's
    last check-in, from before it installed what that check-in delivered, so by that profile a device that
    took the first release never had the task, and a removal concerns only devices that have it: judged by
    the profile, it would run the bad version until its fallback poll. Every stream in the range is nudged
    instead; one that never took the release checks in and is told it is up to date."""
    return (release is not None and release.stage in rollout.TERMINAL and release.exposed
            and bool(release.rollback_envelope.get("signed", {}).get("removed")))


class ReleaseWatch:
    """Per server process: notices release changes and nudges the open streams they make out of date."""

    def __init__(self, service: FleetService, poll_s: float = CHECK_S,
                 checks: Counter | None = None, nudges: Counter | None = None) -> None:
        self.service, self.poll_s = service, poll_s
        self.index = StreamIndex()
        self.checks, self.nudges = checks, nudges  # metrics: staleness checks made, streams nudged
        self._seen: dict[int, CachedRelease] | None = None
        self._kicked: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._beat: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    def start(self) -> None:
        """Started on the event loop that serves the streams (by the first stream, or the server's start)."""
        if self._task is None:
            self._loop = asyncio.get_running_loop()
            self._kicked = asyncio.Event()
            self._task = self._loop.create_task(self._watch())
            self._beat = self._loop.create_task(self._heartbeat())

    def kick(self) -> None:
        """Look now: this process changed a release, or NOTIFY said another did. Safe from any thread."""
        self.service.invalidate()
        loop, kicked = self._loop, self._kicked
        if loop is not None and kicked is not None and not loop.is_closed():
            loop.call_soon_threadsafe(kicked.set)

    def _table(self) -> dict[str, list[CachedRelease]]:
        return self.service._cached_releases()

    async def _watch(self) -> None:
        assert self._kicked is not None
        while not self.closed:
            try:
                table = await run_in_threadpool(self._table)
            except Exception as exc:  # a busy database must not end the watch; the next round retries
                log.warning("release watch failed", extra={"error": repr(exc)})
            else:
                now = {c.id: c for cands in table.values() for c in cands}
                if self._seen is not None:
                    self._nudge(self._seen, now, table)
                self._seen = now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kicked.wait(), self.poll_s)
            self._kicked.clear()

    async def _heartbeat(self) -> None:
        """Each open stream is woken for a ping every `HEARTBEAT_S`, a slot of them at a time. One timer for
        the process: a timed wait per stream (`asyncio.wait_for`) made a task and cancelled it at every ping,
        about a third of a replica's event loop with 10,000 streams open (py-spy, bench/fleet_sim.py --matrix)."""
        for turn in itertools.count():
            await asyncio.sleep(HEARTBEAT_S / HEARTBEAT_SLOTS)
            for stream in self.index.slot(turn):
                stream.nudged.set()

    def _nudge(self, before: dict[int, CachedRelease], now: dict[int, CachedRelease],
               table: dict[str, list[CachedRelease]]) -> None:
        changed = [i for i in before.keys() | now.keys() if _state(before.get(i)) != _state(now.get(i))]
        if not changed:
            return
        streams: dict[int, OpenStream] = {}
        unsure: set[int] = set()  # streams a removal concerns, whatever their profile says
        for i in changed:
            found = concerned(self.index, before.get(i), now.get(i))
            streams.update((s.key, s) for s in found)
            if _removes(now.get(i)):
                unsure.update(s.key for s in found)
        for stream in streams.values():
            if self.checks is not None:
                self.checks.inc()
            # The table just read: no re-read on the loop.
            if stream.key in unsure or self.service.needs_update(stream.profile, table):
                if self.nudges is not None:
                    self.nudges.inc()
                stream.changed = True
                stream.nudged.set()

    def close(self) -> None:
        """End every open stream now (the server is stopping). An open stream never ends by itself, so
        without this the server's graceful stop runs out and cancels them mid-response, which uvicorn logs
        as a CancelledError traceback per stream. Safe to call from a signal handler's thread."""
        self.closed = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for task in (self._task, self._beat):
            if task is not None:
                task.cancel()
        for streams in list(self.index.by_device.values()):
            for stream in streams.values():
                stream.nudged.set()


async def device_events(watch: ReleaseWatch, owner: DeviceIdentity, load_profile: Callable[[], DeviceProfile],
                        open_streams: Gauge | None = None) -> AsyncIterator[bytes]:
    """The event stream of one device: `hello` at once, then `changed` whenever a change concerns it; it ends
    when the server drains (`watch.close()`: the agent reconnects, through the load balancer, elsewhere).
    A nudge that comes while the stream is being opened is not lost: the agent checks in on every `hello`."""
    watch.start()
    profile = await run_in_threadpool(load_profile)
    stream = watch.index.open(owner, profile)
    if open_streams is not None:
        open_streams.inc()
    try:
        yield sse("hello", {})
        while not watch.closed:
            await stream.nudged.wait()  # a change, the heartbeat's turn, or the server stopping
            stream.nudged.clear()
            if watch.closed:
                return  # the server is stopping: end the response cleanly (the device reconnects elsewhere)
            if stream.changed:
                stream.changed = False
                yield sse("changed", {})
            else:
                yield b": ping\n\n"
    finally:
        watch.index.close(stream)
        if open_streams is not None:
            open_streams.dec()
