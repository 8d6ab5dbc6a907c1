"""Progress of a long step on stderr: silent when it ends within a second, then a line every few seconds.

Loading a GGUF takes 12-110 s on a 2-core machine and a large program's `auto` load several seconds; without
a word the command looks hung. `with Progress("loading model.gguf"):` prints `loading model.gguf ...` once
the step has run `after_s`, `loading model.gguf: 10 s` every `every_s` after, and `loading model.gguf: done
in 12.3 s` at the end; a step that ends sooner prints nothing, so quick commands stay quiet.
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO


class Progress:
    def __init__(self, what: str, *, after_s: float = 1.0, every_s: float = 10.0, stream: TextIO | None = None) -> None:
        self.what, self.after_s, self.every_s = what, after_s, every_s
        self.stream = stream if stream is not None else sys.stderr
        self.said = threading.Event()  # set once the first line is out (tests wait on it)
        self._done = threading.Event()
        self._start = 0.0
        self._thread: threading.Thread | None = None

    def _say(self, line: str) -> None:
        print(line, file=self.stream, flush=True)

    def _tick(self) -> None:
        if self._done.wait(self.after_s):
            return
        self._say(f"{self.what} ...")
        self.said.set()
        while not self._done.wait(self.every_s):
            self._say(f"{self.what}: {time.monotonic() - self._start:.0f} s")

    def __enter__(self) -> Progress:
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._tick, name="edgerun-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()
        if self.said.is_set() and kind is None:
            self._say(f"{self.what}: done in {time.monotonic() - self._start:.1f} s")
