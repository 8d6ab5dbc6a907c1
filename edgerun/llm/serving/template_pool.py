"""Chat templates rendered out of the server's process, with a time and a memory bound.

A chat template is code from the model file (Jinja2). The sandbox stops attribute escapes, but not a loop of
10^10 iterations or `'a' * 4e9`; rendered on the event loop such a template froze the whole server. Here a
render runs in a worker process (template_worker.py) whose address space is capped; the calling thread waits
at most `timeout_s` for its answer, then kills the worker and starts another. Callers run `render` in a
thread (it blocks), so the event loop keeps answering other requests meanwhile.
"""

from __future__ import annotations

import json
import os
import queue
import selectors
import subprocess
import sys
import time
from typing import Any

from edgerun.errors import EdgerunError

START_TIMEOUT_S = 60.0  # for a worker process to start (Python and Jinja2 imported), on a loaded host


class _Worker:
    def __init__(self, memory_bytes: int, max_chars: int) -> None:
        env = dict(os.environ)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edgerun.llm.serving.template_worker", str(memory_bytes), str(max_chars)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
        assert self.process.stdout is not None
        self.buffer, self.ready = b"", False

    def ask(self, request: bytes, timeout_s: float) -> dict[str, Any] | None:
        """The worker's reply, or None when it does not answer within `timeout_s` (or died). The time bound
        starts once the worker has started (its first line): a process start on a loaded host is not the
        template's time."""
        process = self.process
        assert process.stdin is not None and process.stdout is not None
        if not self.ready:
            if self._line(time.monotonic() + START_TIMEOUT_S) != b"ready":
                return None
            self.ready = True
        try:
            process.stdin.write(request)
            process.stdin.flush()
        except OSError:
            return None
        line = self._line(time.monotonic() + timeout_s)
        if line is None:
            return None
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _line(self, deadline: float) -> bytes | None:
        assert self.process.stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            while b"\n" not in self.buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    return None
                chunk = os.read(self.process.stdout.fileno(), 1 << 16)
                if not chunk:
                    return None
                self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


class TemplatePool:
    def __init__(self, *, workers: int, timeout_s: float, memory_bytes: int, max_chars: int) -> None:
        self.timeout_s, self.memory_bytes, self.max_chars = timeout_s, memory_bytes, max_chars
        self._idle: queue.Queue[_Worker | None] = queue.Queue()
        for _ in range(workers):
            self._idle.put(None)  # a slot; its worker starts on first use
        self._closed = False

    def start(self) -> None:
        """Start every worker now (a first request then does not wait for a process to start)."""
        slots = [self._idle.get() for _ in range(self._idle.qsize())]
        for worker in slots:
            self._idle.put(worker or _Worker(self.memory_bytes, self.max_chars))

    def render(self, template: str, messages: list[dict[str, Any]], *, add_generation_prompt: bool = True,
               special: dict[str, str] | None = None) -> str:
        if self._closed:
            raise EdgerunError("the server is shutting down")
        request = (json.dumps({"template": template, "messages": messages,
                               "add_generation_prompt": add_generation_prompt, "special": special or {}}) +
                   "\n").encode()
        worker = self._idle.get() or _Worker(self.memory_bytes, self.max_chars)
        keep: _Worker | None = None
        try:
            reply = worker.ask(request, self.timeout_s)
            if reply is None:
                raise EdgerunError(f"the chat template did not finish within {self.timeout_s:g} s; it was stopped")
            if reply.get("fatal") is None:
                keep = worker
            if "error" in reply:
                raise EdgerunError(str(reply["error"]))
            return str(reply["text"])
        finally:
            if keep is None:  # stopped, or out of memory: a fresh worker starts now, not on the next request
                worker.kill()
                keep = None if self._closed else _Worker(self.memory_bytes, self.max_chars)
            self._idle.put(keep)

    def close(self) -> None:
        self._closed = True
        while True:
            try:
                worker = self._idle.get_nowait()
            except queue.Empty:
                return
            if worker is not None:
                worker.kill()
