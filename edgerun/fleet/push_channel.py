"""Push-then-pull, the push half: one server-sent-event stream per device that says "something changed".

The stream carries no release data, only a nudge; the device then pulls its signed assignment by checking
in as always, so nothing it receives here needs to be trusted. Each server process watches the release
table (its own cache, refreshed every `CHECK_S`, so a publish made through another process is noticed too)
and, when it changes, asks for every open stream whether that device is now out of date; only those are
nudged, so a release reaches the devices it targets and nobody else checks in for it. A comment line every
`HEARTBEAT_S` lets both ends notice a dead connection. The stream is opened with the device's own bearer
token (GET, no body; the body limits of /v1/devices/ apply to it like to any device route).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.concurrency import run_in_threadpool
from prometheus_client import Gauge

from edgerun.fleet.errors import FleetError
from edgerun.fleet.push_client import HEARTBEAT_S
from edgerun.fleet.service import DeviceIdentity, FleetService

log = logging.getLogger("edgerun.fleet.server")
CHECK_S = 0.5  # how often one process compares the release table with what it last saw


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


class ReleaseWatch:
    """Per server process: a generation number that goes up whenever the release table changes."""

    def __init__(self, service: FleetService) -> None:
        self.service = service
        self.generation = 0
        self._changed: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._signature: tuple[Any, ...] | None = None
        self.closed = False

    def _current_signature(self) -> tuple[Any, ...]:
        releases = self.service._cached_releases()
        return tuple(sorted((c.id, c.version, c.stage, c.exposure, c.exposed) for cands in releases.values()
                            for c in cands))

    async def _watch(self) -> None:
        while True:
            try:
                signature = await run_in_threadpool(self._current_signature)
            except Exception as exc:  # a busy database must not end the watch; the next round retries
                log.warning("release watch failed", extra={"error": repr(exc)})
            else:
                if signature != self._signature:
                    self._signature = signature
                    self.bump()
            await asyncio.sleep(CHECK_S)

    def bump(self) -> None:
        """Wake every open stream (a publish through this process calls it at once)."""
        self.generation += 1
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()

    def close(self) -> None:
        """End every open stream now (the server is stopping). An open stream never ends by itself, so
        without this the server's graceful stop runs out and cancels them mid-response, which uvicorn logs
        as a CancelledError traceback per stream. Safe to call from a signal handler's thread."""
        self.closed = True
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._changed is not None:
            self._changed.set()

    async def wait(self, generation: int, timeout_s: float) -> int:
        """The generation once it moved past `generation`, or the same one after `timeout_s`."""
        if self._task is None:  # started on the event loop that serves the streams
            self._changed = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            self._task = self._loop.create_task(self._watch())
        if self.generation != generation:
            return self.generation
        assert self._changed is not None
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), timeout_s)
        return self.generation


async def device_events(watch: ReleaseWatch, owner: DeviceIdentity, stale: Callable[[DeviceIdentity], bool],
                        open_streams: Gauge | None = None) -> AsyncIterator[bytes]:
    """The event stream of one device: `hello` at once, then `changed` whenever a change concerns it; it ends
    when the server drains (`watch.close()`: the agent reconnects, through the load balancer, elsewhere)."""
    if open_streams is not None:
        open_streams.inc()
    try:
        async for chunk in _events(watch, owner, stale):
            yield chunk
    finally:
        if open_streams is not None:
            open_streams.dec()


async def _events(watch: ReleaseWatch, owner: DeviceIdentity, stale: Callable[[DeviceIdentity], bool]
                  ) -> AsyncIterator[bytes]:
    generation = watch.generation
    yield sse("hello", {"generation": generation})
    while not watch.closed:
        seen = await watch.wait(generation, HEARTBEAT_S)
        if watch.closed:
            return  # the server is stopping: end the response cleanly (the device reconnects later)
        if seen == generation:
            yield b": ping\n\n"
            continue
        generation = seen
        try:
            concerned = await run_in_threadpool(stale, owner)
        except FleetError:
            concerned = True  # no stored profile yet: let the device check in and find out
        if concerned:
            yield sse("changed", {"generation": generation})
