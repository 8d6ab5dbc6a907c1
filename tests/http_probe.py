"""Hostile HTTP clients for the bounded-server tests: huge bodies over raw loopback sockets, declared or
chunked, that stop sending as soon as the server answers, and a server's resident memory from /proc."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

CHUNK = 64 * 1024


def rss_mb(pid: int, field_name: str = "VmRSS") -> float:
    """Resident memory of a process now (VmRSS), or the most it ever held (VmHWM)."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field_name + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field_name} for pid {pid}")


@dataclass
class Answer:
    status: int
    body: bytes
    sent: int  # body bytes this client managed to send before the answer came (or the server hung up)


def _read_answer(sock: socket.socket, timeout_s: float) -> tuple[int, bytes]:
    sock.settimeout(timeout_s)
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        if not piece:
            break
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")[1:]
                   if line.lower().startswith(b"content-length:")), None)
    while length is not None and len(body) < length:
        piece = sock.recv(65536)
        if not piece:
            break
        body += piece
    return status, body


def _head(method: str, path: str, port: int, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def send_huge(port: int, method: str, path: str, total: int, headers: dict[str, str] | None = None,
              chunked: bool = False, timeout_s: float = 60.0) -> Answer:
    """Send a `total`-byte body (declared with Content-Length, or chunked), stopping as soon as the server
    answers; returns the answer and how much of the body went out before it."""
    headers = dict(headers or {})
    if chunked:
        headers["Transfer-Encoding"] = "chunked"
    else:
        headers["Content-Length"] = str(total)
    headers.setdefault("Content-Type", "application/json")
    sent = 0
    block = b"[" + b"1," * (CHUNK // 2 - 1) + b"1"  # JSON-ish bytes, CHUNK long
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(_head(method, path, port, headers))
        try:
            while sent < total:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    break  # the server answered (or hung up) before the body ended
                piece = block[: min(CHUNK, total - sent)]
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                sent += len(piece)
            if chunked and sent >= total:
                sock.sendall(b"0\r\n\r\n")
        except OSError:
            pass  # the server closed the connection on us: read what it answered before
        status, body = _read_answer(sock, timeout_s)
    return Answer(status, body, sent)


@dataclass
class Responsiveness:
    """Small requests sent in a loop beside an attack (any answer below 500 counts); the slowest answer
    tells whether the event loop froze."""

    url: str
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Responsiveness:
        def loop() -> None:
            with httpx.Client(timeout=30) as client:
                while not self._stop.is_set():
                    start = time.perf_counter()
                    try:
                        ok = client.get(self.url).status_code < 500
                    except httpx.HTTPError:
                        ok = False
                    self.latencies.append(time.perf_counter() - start)
                    self.failures += not ok
                    answered.set()
                    self._stop.wait(0.02)

        answered = threading.Event()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        answered.wait(30)  # the loop is running before the attack starts
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    @property
    def slowest_s(self) -> float:
        return max(self.latencies, default=0.0)


def memory_growth(pid: int, attack: Callable[..., Answer], *args: Any, **kwargs: Any) -> tuple[Answer, float]:
    """Run `attack`; return its answer and how far the server's peak resident memory rose above what it
    held before (MB): a body buffered even for a moment shows in the peak."""
    with open(f"/proc/{pid}/clear_refs", "w") as clear:
        clear.write("5")  # reset the peak (VmHWM) to what the process holds now
    before = rss_mb(pid)
    answer = attack(*args, **kwargs)
    return answer, rss_mb(pid, "VmHWM") - before
