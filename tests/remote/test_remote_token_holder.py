"""What a client that holds a token can and cannot do (docs/security.md, rows R12-R13): failed handshakes
are rate-limited per peer address (a throttled peer is refused unchecked, even with the right token), and
a device started with --allow-programs runs only the program files it lists."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import zmq
from remote_testkit import start_server

import edgerun
from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program
from edgerun.remote_server.auth import FailedHandshakeLimiter, HandshakeAuthenticator

TOKEN = "a-token-of-24-characters"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _zap(auth: HandshakeAuthenticator, address: str, password: str) -> bytes:
    request = [b"1.0", b"7", b"edgerun", address.encode(), b"", b"PLAIN", b"edgerun", password.encode()]
    return auth._answer(request)[2]


def test_failed_handshakes_are_rate_limited_per_address() -> None:
    clock = Clock()
    ctx = zmq.Context()
    auth = HandshakeAuthenticator(ctx, [TOKEN], None, FailedHandshakeLimiter(burst=3, refill_s=6.0, clock=clock))
    try:
        assert [_zap(auth, "10.0.0.1", f"guess-{i}") for i in range(3)] == [b"400"] * 3
        assert _zap(auth, "10.0.0.1", TOKEN) == b"400"  # over budget: refused unchecked
        assert _zap(auth, "10.0.0.2", TOKEN) == b"200"  # another address is not affected
        clock.now += 6.0  # one more attempt earned
        assert _zap(auth, "10.0.0.1", TOKEN) == b"200"
        assert _zap(auth, "10.0.0.1", "guess") == b"400" and _zap(auth, "10.0.0.1", TOKEN) == b"400"
        assert auth.limiter.throttled == 2
    finally:
        auth.stop()
        ctx.term()


def test_a_real_server_throttles_a_guessing_peer(tmp_path: Path) -> None:
    server = start_server(tmp_path, "--handshake-burst", "3", "--handshake-refill-s", "3600")
    try:
        for i in range(3):
            with pytest.raises(EdgerunError, match="refused the token"):
                edgerun.connect(server.url, f"wrong-token-number-{i}", timeout=10)
        with pytest.raises(EdgerunError, match="refused the token"):
            edgerun.connect(server.url, server.token, timeout=10)
    finally:
        server.stop()


def _program(scale: float) -> Program:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((2,), "float32"))
    g.outputs = [b.emit("mul", [x, b.const(np.float32([scale, scale]))])]
    return Program(graph=g)


def test_only_listed_programs_run_on_a_device_that_lists_them(tmp_path: Path) -> None:
    allowed, other = _program(2.0), _program(3.0)
    allowed.save(tmp_path / "allowed.erp")
    digest = hashlib.sha256((tmp_path / "allowed.erp").read_bytes()).hexdigest()
    (tmp_path / "programs.txt").write_text(f"# sha256sum output\n{digest}  allowed.erp\n")
    server = start_server(tmp_path, "--allow-programs", str(tmp_path / "programs.txt"))
    try:
        with edgerun.connect(server.url, server.token, timeout=30) as remote:
            assert remote.upload(tmp_path / "allowed.erp", name="f") == "f"
            np.testing.assert_array_equal(remote.function("f")(np.float32([1, 2]))[0].numpy(), [2, 4])
            other.save(tmp_path / "other.erp")
            with pytest.raises(EdgerunError, match=r"program sha256 [0-9a-f]{64} is not one this device may run"):
                remote.upload(tmp_path / "other.erp", name="g")
    finally:
        server.stop()
