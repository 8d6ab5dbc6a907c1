"""Running an app on loopback for the server tests, and a gate that paces the engine a model call at a time
(the engine calls it before each call), so the tests count steps instead of timing anything."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def running_server(app: Any) -> Iterator[str]:
    """Serve `app` with uvicorn in a thread on a free port; yields the base URL (no /v1)."""
    import uvicorn

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the server did not start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


def wait_until(condition: Callable[[], Any], what: str, limit_s: float = 60.0) -> None:
    """Poll `condition` (a deadline only against hanging forever; no test asserts how long this takes)."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


class StepGate:
    """Held, the engine waits before its next model call until `allow(n)` lets n calls through; `open()`
    lets everything through."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._permits: int | None = None  # None: open
        self.waiting = False  # the engine is waiting at the gate

    def __call__(self) -> None:
        with self._cv:
            self.waiting = True
            self._cv.notify_all()
            while self._permits == 0:
                self._cv.wait()
            if self._permits is not None:
                self._permits -= 1
            self.waiting = False

    def hold(self) -> None:
        with self._cv:
            self._permits = 0

    def allow(self, n: int) -> None:
        with self._cv:
            self._permits = (self._permits or 0) + n
            self._cv.notify_all()

    def open(self) -> None:
        with self._cv:
            self._permits = None
            self._cv.notify_all()
