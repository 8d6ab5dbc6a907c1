"""A value read from the database and held for a while (the trust root, the admin token's hash, the release
table), re-read without ever making the event loop wait on the database.

Every server process keeps such values and re-reads them each period, because another replica may have
changed them. A worker thread (a sync route, the monitor) reads through `get()`, which re-reads in the calling
thread when the value is due. The event loop reads through `get_async()`, which never runs a statement on the
loop: a value held past its period is answered at once while one re-read runs in the loop's executor (the
period bounds how stale a view may be; a database slow to answer lengthens it by that wait instead of
stopping every request of the process), and only a value never read, or one `invalidate()`d (a write of this
process, a NOTIFY from another), is waited for, off the loop, by one shared re-read.

A database error during a re-read keeps the held value (nothing can change it while the database is away)
and tries again `retry_s` later; with nothing held, it is raised to the caller.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import sqlalchemy as sa

log = logging.getLogger("edgerun.fleet.server")
T = TypeVar("T")


class Refreshed(Generic[T]):
    def __init__(self, load: Callable[[T | None], T], period_s: float, clock: Callable[[], float],
                 retry_s: float = 1.0) -> None:
        """`load(held)` reads the value (it is given the one held, or None); `clock` is monotonic seconds."""
        self._load, self.period_s, self._clock, self.retry_s = load, period_s, clock, retry_s
        self._lock = threading.Lock()
        self._value: T | None = None
        self._read_at = 0.0
        self._generation = 0      # raised by each invalidate()
        self._read_generation = -1  # the generation the held value was read in
        self._flight: tuple[asyncio.AbstractEventLoop, asyncio.Future[T]] | None = None
        self._reading = False  # a worker thread's re-read of a value past its period is under way (`get`)

    def invalidate(self) -> None:
        """The held value is out of date (this process wrote, or was told another did): the next reader waits
        for a re-read. Safe from any thread; a re-read already under way when this is called does not count."""
        with self._lock:
            self._generation += 1

    def held(self) -> T | None:
        return self._value

    def _state(self) -> tuple[T | None, bool, bool]:
        """(held value, due for a re-read, must be waited for: never read or invalidated)."""
        with self._lock:
            value, current = self._value, self._read_generation == self._generation
            due = not current or self._clock() - self._read_at >= self.period_s
        return value, due, value is None or not current

    def read(self) -> T:
        """Re-read now, in the calling thread."""
        with self._lock:
            generation, held = self._generation, self._value
        started = self._clock()
        try:
            value = self._load(held)
        except sa.exc.DBAPIError:
            if held is None:
                raise
            with self._lock:  # the database away: keep what is held, look again in retry_s
                self._read_generation = max(self._read_generation, generation)
                self._read_at = started - self.period_s + self.retry_s
            return held
        with self._lock:
            if generation >= self._read_generation:
                self._value, self._read_generation, self._read_at = value, generation, started
        return value

    def get(self) -> T:
        """The value, re-read in the calling thread when due (for worker threads, never the event loop). A value
        merely past its period, while another thread already re-reads it, is answered as held: under a burst
        (a step's devices all fetching their assignments) every worker thread used to re-read the same table
        at once."""
        value, due, must_wait = self._state()
        if not due:
            assert value is not None
            return value
        if not must_wait:
            with self._lock:
                if self._reading:
                    assert value is not None
                    return value
                self._reading = True
            try:
                return self.read()
            finally:
                with self._lock:
                    self._reading = False
        return self.read()

    async def get_async(self) -> T:
        """The value, for the event loop: no statement ever runs on it (see the module's docstring)."""
        while True:
            value, due, must_wait = self._state()
            if not due:
                assert value is not None
                return value
            flight = self._start_read()
            if not must_wait:
                assert value is not None
                return value
            await asyncio.shield(flight)
            # A re-read that began before an invalidate() does not satisfy it: the loop starts another.

    def _start_read(self) -> asyncio.Future[T]:
        """The re-read under way on this loop, or a new one in the loop's executor."""
        loop = asyncio.get_running_loop()
        if self._flight is not None and self._flight[0] is loop and not self._flight[1].done():
            return self._flight[1]
        future = loop.run_in_executor(None, self.read)
        future.add_done_callback(_log_failure)
        self._flight = (loop, future)
        return future


def _log_failure(future: asyncio.Future[Any]) -> None:
    """A background re-read nobody waits for must not fail silently (nor warn "exception never retrieved")."""
    if not future.cancelled() and future.exception() is not None:
        log.warning("cache re-read failed", extra={"error": repr(future.exception())})
