"""ONNX -> .mnn through MNN's converter, in a child process that lives as long as this one (see
convert_child.py for why). Started on the first conversion, about 40 ms; it keeps its allocator and the
converter's tables warm, which a process per conversion would not (ResNet-18 converted 1.2 s slower that
way). One conversion at a time per process: a lock serialises callers, as the in-process call did."""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from edgerun.errors import EdgerunError

CHILD_SCRIPT = Path(__file__).with_name("convert_child.py")


class ConverterProcess:
    """The conversion child; restarted after it dies (a converter abort)."""

    def __init__(self, converter_dir: str) -> None:
        self.converter_dir = converter_dir
        self.lock = threading.Lock()
        self.child: subprocess.Popen[str] | None = None
        # A forked process starts its own child: it must not write into its parent's pipe, nor wait on a
        # lock some other thread of the parent held at the fork.
        os.register_at_fork(after_in_child=self._forget_parents_child)

    def _forget_parents_child(self) -> None:
        self.lock = threading.Lock()
        self.child = None

    def _started(self) -> subprocess.Popen[str]:
        if self.child is None or self.child.poll() is not None:
            self.child = subprocess.Popen([sys.executable, "-I", str(CHILD_SCRIPT), self.converter_dir],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True, cwd="/")
            atexit.register(self.close)
        return self.child

    def close(self) -> None:
        """End the child (its loop stops at the end of its input)."""
        child, self.child = self.child, None
        if child is not None and child.poll() is None:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.close()
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
            child.stdout.close()

    def convert(self, folder: Path, args: list[str]) -> None:
        """Run `_tools.mnnconvert(args)` with `folder` as the working directory; EdgerunError with the
        converter's log when the child reports an error or dies."""
        with self.lock:
            child = self._started()
            assert child.stdin is not None and child.stdout is not None
            try:
                child.stdin.write(json.dumps([str(folder), *args]) + "\n")
                child.stdin.flush()
                reply = child.stdout.readline().strip()
            except BrokenPipeError:
                reply = ""
            if reply == "ok":
                return
            if not reply:  # it died mid-conversion: reap it so the next call starts a fresh one
                child.wait()
                reply = f"the converter process ended with exit code {child.returncode}"
            self.child = None if child.poll() is not None else child
        log_path = folder / "convert.log"
        log = log_path.read_text(errors="replace").strip().splitlines()[-8:] if log_path.exists() else []
        raise EdgerunError(f"MNN's converter failed: {reply}" + (": " + " | ".join(log) if log else ""))
