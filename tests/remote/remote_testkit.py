"""Real device servers for the remote-runtime tests: `edgerun serve` in subprocesses on loopback."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zmq

import edgerun
from edgerun.remote.client import RemoteDevice
from edgerun.remote.keys import init_keys, read_key_pair, read_public_key


@dataclass
class ServerProcess:
    proc: subprocess.Popen[str]
    url: str
    token: str
    tokens: list[str] = field(default_factory=list)  # one per client; token == tokens[0]
    server_key: Path | None = None  # the server's public key file (CURVE servers)
    client_keys: list[Path] = field(default_factory=list)  # allowed clients' secret key files

    @property
    def address(self) -> str:
        return self.url.removeprefix("tcp://")

    def connect(self, client: int = 0, **kw: Any) -> RemoteDevice:
        if self.server_key is not None:
            return edgerun.connect(self.url, server_key=self.server_key, client_key=self.client_keys[client], **kw)
        return edgerun.connect(self.url, self.tokens[client], **kw)

    def memory(self, field_name: str = "VmHWM") -> int:
        """The server's peak (VmHWM) or current (VmRSS) resident bytes."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field_name + ":"))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _launch(args: list[str], env: dict[str, str] | None) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "edgerun", "serve", "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        proc.kill()
        raise RuntimeError(f"server did not start: {line!r} {proc.stderr.read() if proc.stderr else ''}")
    return proc, line.split("listening on ")[1].split()[0]


def start_server(tmp: Path, *extra: str, env: dict[str, str] | None = None, clients: int = 1) -> ServerProcess:
    """A token server: a token file of `clients` lines, each one client."""
    tokens = [secrets.token_hex(24) for _ in range(clients)]
    token_file = tmp / f"token-{secrets.token_hex(4)}"
    token_file.write_text("\n".join(tokens) + "\n")
    proc, url = _launch(["--token-file", str(token_file), *extra], env)
    return ServerProcess(proc, url, tokens[0], tokens)


def start_curve_server(tmp: Path, *extra: str, clients: int = 1, token: bool = False) -> ServerProcess:
    """A CURVE server allowing `clients` fresh client key pairs (their public keys in one folder)."""
    d = tmp / f"keys-{secrets.token_hex(4)}"
    server_public, server_secret = init_keys(d / "server", "server")
    allowed = d / "allowed"
    client_keys = []
    for i in range(clients):
        public, secret = init_keys(d / "clients", f"client{i}")
        allowed.mkdir(exist_ok=True)
        (allowed / public.name).write_text(public.read_text())
        client_keys.append(secret)
    args = ["--curve-secret", str(server_secret), "--curve-allow", str(allowed)]
    tokens: list[str] = []
    if token:
        tokens = [secrets.token_hex(24)]
        (d / "token").write_text(tokens[0])
        args += ["--token-file", str(d / "token")]
    proc, url = _launch([*args, *extra], None)
    return ServerProcess(proc, url, tokens[0] if tokens else "", tokens, server_public, client_keys)


class RawPeer:
    """A hand-driven DEALER socket: sends whatever frames a test wants, waits a bounded time for a reply.

    `token`: the PLAIN password (None: no security mechanism at all); `curve`: (server public key file,
    client secret key file)."""

    def __init__(self, url: str, token: str | None = None, curve: tuple[Path, Path] | None = None) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if curve is not None:
            pair = read_key_pair(curve[1])
            self.sock.setsockopt(zmq.CURVE_SERVERKEY, read_public_key(curve[0]))
            self.sock.setsockopt(zmq.CURVE_PUBLICKEY, pair.public)
            self.sock.setsockopt(zmq.CURVE_SECRETKEY, pair.secret)
        elif token is not None:
            self.sock.setsockopt(zmq.PLAIN_USERNAME, b"edgerun")
            self.sock.setsockopt(zmq.PLAIN_PASSWORD, token.encode())
        self.sock.connect(url)

    def ask(self, frames: list[bytes], timeout_ms: int = 5000) -> dict | None:
        self.sock.send_multipart(frames)
        if not self.sock.poll(timeout_ms):
            return None
        return json.loads(self.sock.recv_multipart()[0])

    def close(self) -> None:
        self.sock.close(0)
        self.ctx.term()


def header(**fields: object) -> bytes:
    return json.dumps({"v": 1, "id": 1, "args": {}, "tensors": [], **fields}).encode()
