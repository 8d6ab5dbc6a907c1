"""Security of the device server: tokens, bounded sizes, malformed input, no arbitrary code, loopback default."""

from __future__ import annotations

import contextlib
import json
import pickle
import random
import time

import numpy as np
import pytest
import zmq
from remote_testkit import RawPeer, ServerProcess, header, start_server

import edgerun
from edgerun.cli import build_parser
from edgerun.errors import EdgerunError, RemoteError
from edgerun.remote_server.server import DeviceServer

METHODS = ["hello", "open_session", "close_session", "upload", "put", "empty", "get", "free", "call", "describe"]


def _header(**fields: object) -> bytes:
    return header(**fields)


def test_every_method_refuses_a_missing_or_wrong_token(server: ServerProcess) -> None:
    # In the handshake: a peer without the token (no mechanism, empty, wrong, near misses) is refused before
    # any of its messages is accepted, whatever method they name; none reaches the application.
    peers = [RawPeer(server.url, token) for token in (None, " ", "wrong" * 8, server.token[:-1], server.token + "x")]
    try:
        for peer in peers:
            peer.sock.setsockopt(zmq.SNDTIMEO, 1000)  # once refused, libzmq has no peer left to queue for
            for method in METHODS:
                with contextlib.suppress(zmq.Again):
                    peer.sock.send_multipart([_header(method=method, token=server.token)])
        assert all(not peer.sock.poll(300) for peer in peers)
    finally:
        for peer in peers:
            peer.close()
    peer = RawPeer(server.url, server.token)
    try:
        # In the header, the token is a second check: an authenticated peer must still send it.
        for method in METHODS:
            for token in (None, "", "wrong" * 8, server.token[:-1], server.token + "x"):
                fields = {"method": method} if token is None else {"method": method, "token": token}
                reply = peer.ask([_header(**fields)])
                assert reply is not None and reply["ok"] is False, (method, token)
                assert reply["error"]["type"] == "Unauthorized"
        ok = peer.ask([_header(method="hello", token=server.token)])
        assert ok is not None and ok["ok"] and ok["result"]["sessions"] == 0  # nothing was opened
        # Only this peer's 51 requests reached the application; the refused peers' 50 never did.
        assert ok["result"]["stats"]["requests"] == len(METHODS) * 5 + 1
        assert ok["result"]["stats"]["handshakes_refused"] >= 4  # the peer with no mechanism never gets to ZAP
    finally:
        peer.close()
    with pytest.raises(EdgerunError, match="refused the token"):
        edgerun.connect(server.url, "not-the-token-at-all", timeout=10)


def test_sizes_are_bounded_with_clear_errors(tmp_path) -> None:
    srv = start_server(tmp_path, "--max-message-mb", "1")
    try:
        with edgerun.connect(srv.url, srv.token, timeout=10) as remote:
            assert remote.limits.max_message_bytes == 1 << 20
            with pytest.raises(EdgerunError, match="exceeds the device's limit"):
                remote.tensor(np.zeros(1 << 19, np.float32))  # 2 MiB
            peer = RawPeer(srv.url, srv.token)
            # libzmq drops an oversized message (and that peer) before buffering it; the server lives on.
            assert peer.ask([_header(method="put", token=srv.token), b"\0" * (2 << 20)], 1000) is None
            peer.close()
            big_header = _header(method="hello", token=srv.token, pad="x" * 70_000)
            peer = RawPeer(srv.url, srv.token)
            reply = peer.ask([big_header])
            assert reply is not None and reply["error"]["type"] == "BadRequest" and "exceeds" in reply["error"]["message"]
            lying = json.dumps({"v": 1, "id": 2, "token": srv.token, "method": "put",
                                "args": {"session": remote.session},
                                "tensors": [{"dtype": "float32", "shape": [1000]}]}).encode()
            reply = peer.ask([lying, b"\0" * 12])
            assert reply is not None and "frame has 12" in reply["error"]["message"]
            peer.close()
            assert remote.tensor(np.arange(4, dtype=np.int32)).numpy().tolist() == [0, 1, 2, 3]
    finally:
        srv.stop()


def _malformed_messages(token: str, rng: random.Random) -> list[list[bytes]]:
    good = {"v": 1, "id": 1, "token": token, "method": "put", "args": {"session": "s"},
            "tensors": [{"dtype": "float32", "shape": [2]}]}
    out: list[list[bytes]] = []
    for i in range(1000):
        kind = i % 8
        if kind == 0:
            out.append([rng.randbytes(rng.randint(0, 200))])
        elif kind == 1:
            out.append([b"{" * rng.randint(1, 5000)])
        elif kind == 2:
            h = dict(good)
            key = rng.choice(list(h))
            h[key] = rng.choice([None, 7, -1, "x", [], {}, [[]], 1e308, True])
            out.append([json.dumps(h).encode(), rng.randbytes(8)])
        elif kind == 3:
            h = dict(good, tensors=[{"dtype": rng.choice(["float64", "int4", "", "float32"]),
                                     "shape": rng.choice([[-1], [2**62], ["a"], [2, 2, 2, 2, 2, 2, 2, 2, 2], [2]])}])
            out.append([json.dumps(h).encode(), rng.randbytes(rng.randint(0, 16))])
        elif kind == 4:
            out.append([json.dumps(dict(good, tensors=[])).encode(), *[rng.randbytes(4)] * rng.randint(1, 300)])
        elif kind == 5:
            text = bytearray(json.dumps(good).encode())
            for _ in range(rng.randint(1, 5)):
                text[rng.randrange(len(text))] = rng.randrange(256)
            out.append([bytes(text), rng.randbytes(8)])
        elif kind == 6:
            h = dict(good, method=rng.choice(["call", "get", "empty", "free", "upload"]),
                     args=rng.choice([{"session": 5}, {"shape": "big"}, {"handles": "t0"}, [], {"function": {}}]))
            out.append([json.dumps(h).encode()])
        else:
            out.append([json.dumps([1, 2, 3]).encode(), b""])
    return out


def test_server_survives_a_thousand_malformed_messages(server: ServerProcess) -> None:
    peer = RawPeer(server.url, server.token)
    replies = 0
    try:
        for frames in _malformed_messages(server.token, random.Random(7)):
            reply = peer.ask(frames, timeout_ms=5000)
            assert reply is not None, f"no reply to {frames[0][:80]!r}"
            assert reply["ok"] is False or frames[0].startswith(b"{")
            replies += 1
    finally:
        peer.close()
    assert replies == 1000
    assert server.proc.poll() is None
    with edgerun.connect(server.url, server.token, timeout=10) as remote:
        assert remote.tensor(np.ones(2, np.float32)).numpy().tolist() == [1.0, 1.0]


def test_no_client_can_run_arbitrary_python(server: ServerProcess) -> None:
    peer = RawPeer(server.url, server.token)
    try:
        for method in ("__init__", "_upload", "serve_forever", "stop", "handle", "__class__", "exec", "eval"):
            reply = peer.ask([_header(method=method, token=server.token)])
            assert reply is not None and reply["error"]["type"] == "BadRequest", method
    finally:
        peer.close()

    class Boom:
        def __reduce__(self) -> tuple:
            return (print, ("pwned",))

    with edgerun.connect(server.url, server.token, timeout=10) as remote:
        payload = np.frombuffer(pickle.dumps(Boom()), dtype=np.uint8)
        with pytest.raises(RemoteError, match="ProgramFormatError"):
            remote.request("upload", {"name": "evil"}, [payload])
        with pytest.raises(RemoteError, match="serves the backends"):
            remote.request("upload", {"name": "evil", "backends": ["os"]}, [payload])
        assert remote.request("describe")[0]["functions"] == []


def test_default_bind_is_loopback() -> None:
    args = build_parser().parse_args(["serve", "--token-file", "t"])
    assert args.host == "127.0.0.1"
    srv = DeviceServer("t" * 32)
    try:
        assert srv.url.startswith("tcp://127.0.0.1:")
    finally:
        srv.stop()
        srv._sock.close(0)
    with pytest.raises(EdgerunError, match="at least 16"):
        DeviceServer("short")
    start = time.monotonic()
    assert time.monotonic() - start < 5
