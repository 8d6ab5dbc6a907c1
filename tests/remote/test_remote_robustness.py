"""The server survives bad clients; clients get clear errors, not hangs, when the server dies."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from remote_testkit import ServerProcess, start_server
from test_remote_api import _mlp_program

import edgerun
from edgerun.errors import EdgerunError


def test_server_survives_a_client_that_disconnects_mid_transfer(server: ServerProcess) -> None:
    host, port = server.address.rsplit(":", 1)
    # 1. Raw TCP: a ZMTP greeting, then the start of a long frame, then gone.
    for cut in (3, 10, 64, 200):
        with socket.create_connection((host, int(port)), timeout=5) as s:
            greeting = b"\xff" + b"\0" * 8 + b"\x7f\x03\x00NULL" + b"\0" * 16 + b"\0" + b"\0" * 31
            s.sendall(greeting[:cut])
            if cut >= 64:
                s.sendall(b"\x06" + (100 << 20).to_bytes(8, "big") + b"x" * 1000)
    # 2. A real client process killed with SIGKILL while it streams a 256 MB tensor.
    code = textwrap.dedent(f"""
        import numpy as np, edgerun
        r = edgerun.connect({server.url!r}, {server.token!r})
        print("connected", flush=True)
        r.tensor(np.ones(64 << 20, np.float32))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "connected"
    time.sleep(0.3)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert server.proc.poll() is None
    with edgerun.connect(server.url, server.token, timeout=20) as remote:
        remote.upload(_mlp_program(), name="f")
        (out,) = remote.function("f")(np.zeros((4, 8), np.float32), fetch=True)
        assert out.shape == (4, 16)


def test_client_gets_a_clear_error_when_the_server_dies(tmp_path) -> None:
    srv = start_server(tmp_path)
    remote = edgerun.connect(srv.url, srv.token, timeout=2)
    assert remote.tensor(np.ones(2, np.float32)).numpy().sum() == 2
    os.kill(srv.proc.pid, signal.SIGKILL)
    srv.proc.wait()
    start = time.monotonic()
    with pytest.raises(EdgerunError, match="did not answer"):
        remote.tensor(np.ones(2, np.float32))
    assert time.monotonic() - start < 4
    with pytest.raises(EdgerunError, match="did not answer"):
        edgerun.connect(srv.url, srv.token, timeout=1)


def test_two_server_processes_at_once(tmp_path) -> None:
    a, b = start_server(tmp_path), start_server(tmp_path)
    try:
        assert a.url != b.url
        x = np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)
        with edgerun.connect(a.url, a.token) as ra, edgerun.connect(b.url, b.token) as rb:
            ra.upload(_mlp_program(), name="only_on_a")
            (ya,) = ra.function("only_on_a")(x, fetch=True)
            assert rb.request("describe")[0]["functions"] == []
            rb.upload(_mlp_program(), name="on_b")
            (yb,) = rb.function("on_b")(x, fetch=True)
            np.testing.assert_array_equal(ya, yb)
            with pytest.raises(EdgerunError, match="refused the token"):
                edgerun.connect(a.url, b.token)
    finally:
        a.stop()
        b.stop()
