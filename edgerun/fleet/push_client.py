"""The agent's end of the push channel (push_channel.py): a thread that keeps the event stream open and sets
`wake` whenever the agent should check in.

It sets `wake` on every (re)connection too: whatever was published while the stream was down is then found
by that one check-in, so a lost or restarted connection loses nothing; polling at a long interval stays as
the last fallback. The stream is read in bounded pieces: an event line longer than `MAX_LINE` drops the
connection rather than growing the agent's memory.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

import httpx

HEARTBEAT_S = 15.0  # the server sends a comment line this often; a stream silent for 3× as long is dropped
EVENT_PATH = "/v1/devices/{device_id}/events"
MAX_LINE = 4096
log = logging.getLogger(__name__)


class PushListener:
    def __init__(self, server_url: str, device_id: str, headers: Callable[[], dict[str, str]],
                 wake: threading.Event, *, max_backoff_s: float = 30.0) -> None:
        self.url = server_url.rstrip("/") + EVENT_PATH.format(device_id=device_id)
        self.headers, self.wake, self.max_backoff_s = headers, wake, max_backoff_s
        self.connections = 0    # streams opened, for operators and tests
        self.notifications = 0  # "changed" events received
        self._stop = threading.Event()
        self._client = httpx.Client(timeout=httpx.Timeout(10.0, read=3 * HEARTBEAT_S))
        self._thread = threading.Thread(target=self._loop, name=f"push-{device_id}", daemon=True)

    def start(self) -> PushListener:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._client.close()  # ends a read in progress
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        delay = 0.25
        while not self._stop.is_set():
            try:
                self._listen()
                delay = 0.25  # the server ended a stream that worked: reconnect soon
            except Exception as exc:  # any failure of one stream means: wait, then open another
                if self._stop.is_set():
                    return
                log.info("push channel %s: %s; reconnecting", self.url, exc)
            self._stop.wait(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, self.max_backoff_s)

    def _listen(self) -> None:
        with self._client.stream("GET", self.url, headers=self.headers()) as r:
            r.raise_for_status()
            self.connections += 1
            self.wake.set()  # (re)connected: check in once, for anything sent while we were away
            buf = b""
            event = ""
            for chunk in r.iter_raw():  # as it arrives (a chunk_size would wait to fill it)
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.startswith(b"event:"):
                        event = line[6:].strip().decode(errors="replace")
                    elif not line.strip():
                        if event == "changed":
                            self.notifications += 1
                            self.wake.set()
                        event = ""
                if len(buf) > MAX_LINE:
                    raise ValueError(f"an event line over {MAX_LINE} bytes")
                if self._stop.is_set():
                    return
