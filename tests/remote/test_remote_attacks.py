"""The remote-runtime attacks of issue 17, each against a real `edgerun serve` process on loopback.

Each test reproduces one finding and sees it refused, and checks the server's resident memory did not grow by
the attack's size (VmHWM, the peak, so a buffer that came and went still shows).
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from remote_testkit import RawPeer, ServerProcess, header, start_curve_server, start_server

import edgerun
from edgerun.errors import EdgerunError, RemoteError
from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program
from edgerun.remote.keys import init_keys
from edgerun.runtime.arena_limit import available_memory_bytes

MIB, GIB = 1 << 20, 1 << 30


def _greeting(mechanism: bytes) -> bytes:
    """A ZMTP 3.0 greeting, as a hand-written attacker sends it."""
    return b"\xff" + b"\0" * 7 + b"\x01\x7f" + b"\x03\x01" + mechanism.ljust(20, b"\0") + b"\0" + b"\0" * 31


# NULL's READY command with the one property libzmq requires: what a token-less client sent the old server.
_READY_BODY = b"\x05READY\x0bSocket-Type" + (6).to_bytes(4, "big") + b"DEALER\x08Identity" + (0).to_bytes(4, "big")
READY = b"\x04" + bytes([len(_READY_BODY)]) + _READY_BODY


def _flood_raw(address: str, prefix: bytes, total: int, chunk: int = 32 * MIB) -> int:
    """Send `prefix` then `total` bytes of 1 GiB message frames; the bytes the server took before it hung up."""
    host, port = address.rsplit(":", 1)
    sent = 0
    payload = b"\0" * chunk
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(prefix)
        try:
            while sent < total:
                if sent % GIB == 0:
                    s.sendall(b"\x03" + GIB.to_bytes(8, "big"))  # a long frame of 1 GiB, more frames follow
                s.sendall(payload)
                sent += chunk
        except (ConnectionResetError, BrokenPipeError, TimeoutError):
            pass
    return sent


def _send_refused(attacker: RawPeer) -> None:
    """16 frames of 32 MiB from a peer the handshake refuses: no reply ever comes (once libzmq has dropped
    the refused connection, the send itself finds no peer and times out)."""
    attacker.sock.setsockopt(zmq.SNDTIMEO, 2000)
    try:
        attacker.sock.send_multipart([header(method="put", token="x" * 32)] + [b"\0" * (32 * MIB)] * 16)
        assert not attacker.sock.poll(500)
    except zmq.Again:
        pass
    finally:
        attacker.close()


def test_unauthenticated_frames_are_never_buffered(server: ServerProcess) -> None:
    """Finding: "the remote runtime buffers up to frames x 1 GiB before checking the token"."""
    peer = RawPeer(server.url, server.token)
    assert peer.ask([header(method="hello", token=server.token)]) is not None
    before = server.memory()
    # A raw attacker: a greeting without the token (NULL, as the old server accepted), or a PLAIN greeting
    # that skips the authenticating HELLO, then a stream of 1 GiB frames. The handshake ends the connection.
    for mechanism in (b"NULL", b"PLAIN"):
        sent = _flood_raw(server.address, _greeting(mechanism) + READY, 4 * GIB)
        assert sent < 2 * GIB, f"{mechanism!r}: the server kept reading an unauthenticated stream"
    # A libzmq peer with a wrong token: its 16 frames of 32 MiB never leave its own side.
    for bad in ("wrong" * 8, server.token[:-1]):
        _send_refused(RawPeer(server.url, bad))
    assert server.memory() - before < 64 * MIB
    stats = peer.ask([header(method="hello", token=server.token)])
    assert stats is not None and stats["result"]["stats"]["requests"] == 2  # this peer's two hellos, nothing else
    peer.close()
    assert server.proc.poll() is None


def test_max_message_mb_counts_the_whole_multipart_message(tmp_path: Path) -> None:
    """`--max-message-mb` bounds the message, all frames together, not each frame."""
    srv = start_server(tmp_path, "--max-message-mb", "4")
    try:
        peer = RawPeer(srv.url, srv.token)
        frames = [header(method="hello", token=srv.token)] + [b"\0" * (2 * MIB)] * 3  # 3 x 2 MiB, each under 4
        reply = peer.ask(frames)
        assert reply is not None and reply["error"]["type"] == "BadRequest"
        assert "exceeds the limit of 4194304" in reply["error"]["message"]
        assert "all frames together" in reply["error"]["message"]
        # One frame over the limit is dropped by libzmq before it is buffered (the per-frame backstop).
        assert peer.ask([header(method="hello", token=srv.token), b"\0" * (5 * MIB)], 1000) is None
        peer.close()
        with srv.connect(timeout=10) as remote, pytest.raises(EdgerunError, match="exceeds the device's limit"):
            remote.request("put", {}, [np.zeros(MIB, np.uint8)] * 5)  # the client checks the sum too
    finally:
        srv.stop()


def test_declared_empty_tensors_count_against_the_device_budget(tmp_path: Path) -> None:
    """Finding: "accepted 60 GiB of empty tensors on a 23 GiB machine"."""
    srv = start_server(tmp_path, "--max-total-mb", str(12 * 1024), clients=8)  # a device with a 12 GiB budget
    remotes = []
    refusals: list[str] = []
    try:
        before = srv.memory()
        for client in range(8):
            for _ in range(5):
                try:
                    remotes.append(srv.connect(client, timeout=20))
                except RemoteError as exc:
                    refusals.append(str(exc))
        assert len(remotes) == 16  # the device's session count holds, and no client got more than 4
        accepted = 0
        for k in range(60):  # 60 GiB of zero tensors, declared 1 GiB at a time
            try:
                remotes[k % len(remotes)].empty((GIB // 4,), "float32")
                accepted += GIB
            except RemoteError as exc:
                refusals.append(str(exc))
        assert accepted <= 12 * GIB
        with pytest.raises(RemoteError, match="exceeds the tensor limit"):
            remotes[0].empty((1 << 32, 1 << 32), "float32")  # 2^64 elements: 0 in int64 arithmetic
        assert any("the device's sessions would hold more than 12,884,901,888 B" in r for r in refusals)
        assert any("this client already holds 4 sessions" in r for r in refusals)
        assert any("the device already holds 16 sessions" in r for r in refusals)
        assert srv.memory() - before < 256 * MIB
    finally:
        for r in remotes:
            r.close()
        srv.stop()


def test_the_default_device_budget_follows_available_memory(server: ServerProcess) -> None:
    with server.connect() as remote:
        total = remote.info["quotas"]["max_total_bytes"]
    assert 0.5 * available_memory_bytes() < total < 0.9 * available_memory_bytes()


def _relu(shape: tuple[int, ...]) -> Program:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec(shape, "float32"))
    g.outputs = [b.emit("relu", [x])]
    return Program(graph=g)


def test_a_programs_arena_counts_in_full(server: ServerProcess) -> None:
    """Finding: "counted a 12 GiB arena as 11.7 MB of quota" (and 12 TiB arenas were allocated)."""
    before = server.memory()
    with server.connect(timeout=60) as remote:
        for shape, arena in (((3 << 29,), 12 * GIB), ((3 << 19, 1 << 20), 12 << 40)):
            with pytest.raises(RemoteError, match=f"needs an arena of {arena:,} B") as info:
                remote.upload(_relu(shape), name="big")
            assert "nothing was allocated" in str(info.value)
        assert remote.request("describe")[0] == {"functions": [], "tensors": 0, "bytes": 0}
        remote.upload(_relu((1 << 27,)), name="one_gib")  # 512 MiB in, 512 MiB out: a 1 GiB arena
        held = remote.request("describe")[0]["bytes"]
        assert held >= GIB
        remote.empty((GIB // 4,), "float32")
        remote.empty((GIB // 4,), "float32")
        with pytest.raises(RemoteError, match="this session would hold more than 4,294,967,296 B"):
            remote.empty((GIB // 4,), "float32")  # 1 GiB arena + 3 GiB > the 4 GiB session budget
        remote.request("free", {"functions": ["one_gib"]})
        assert remote.request("describe")[0]["bytes"] == 2 * GIB
        remote.empty((GIB // 4,), "float32")  # the arena's bytes came back
    assert server.memory() - before < 256 * MIB


def test_one_client_cannot_hold_every_session(tmp_path: Path) -> None:
    """Finding: "one client can hold all 16 sessions"."""
    srv = start_server(tmp_path, "--max-client-mb", "2048", clients=2)
    mine = []
    try:
        mine = [srv.connect(0, timeout=10) for _ in range(4)]
        mine[0].empty((GIB // 4,), "float32")
        mine[1].empty((GIB // 4,), "float32")
        with pytest.raises(RemoteError, match="this client's sessions would hold more than 2,147,483,648 B"):
            mine[2].empty((GIB // 4,), "float32")  # a client's budget spans its sessions
        with pytest.raises(RemoteError, match="this client already holds 4 sessions, the most one client may hold"):
            srv.connect(0, timeout=10)
        with srv.connect(1, timeout=10) as other:
            assert other.info["client"]["sessions"] == 0
            # Nor can a client use another client's session id.
            with pytest.raises(RemoteError, match="no session"):
                other.request("describe", {"session": mine[0].session})
        mine.pop().close()
        mine.append(srv.connect(0, timeout=10))  # closing one frees its place
    finally:
        for r in mine:
            r.close()
        srv.stop()


def test_curve_an_unknown_key_never_reaches_the_application(tmp_path: Path) -> None:
    srv = start_curve_server(tmp_path, clients=1)
    try:
        _, stranger = init_keys(tmp_path / "stranger", "client")
        assert srv.server_key is not None
        with pytest.raises(EdgerunError, match=r"refused this client's CURVE key .* not in the device's --curve-allow"):
            edgerun.connect(srv.url, server_key=srv.server_key, client_key=stranger, timeout=10)
        friend = RawPeer(srv.url, curve=(srv.server_key, srv.client_keys[0]))
        assert friend.ask([header(method="hello")]) is not None
        before = srv.memory()
        _send_refused(RawPeer(srv.url, curve=(srv.server_key, stranger)))
        sent = _flood_raw(srv.address, _greeting(b"CURVE") + b"\0" * 200, 4 * GIB)
        assert sent < 2 * GIB
        assert srv.memory() - before < 64 * MIB
        stats = friend.ask([header(method="hello")])
        assert stats is not None
        assert stats["result"]["stats"]["requests"] == 2  # the friend's two hellos; no stranger's message
        assert stats["result"]["stats"]["handshakes_refused"] >= 2
        friend.close()
        with srv.connect(timeout=20) as remote:  # an allowed key works end to end, encrypted
            remote.upload(_relu((4,)), name="f")
            (y,) = remote.function("f")(np.float32([-1, 2, -3, 4]), fetch=True)
            np.testing.assert_array_equal(y, [0, 2, 0, 4])
    finally:
        srv.stop()


def test_curve_a_wrong_server_key_fails_with_a_clear_error(tmp_path: Path) -> None:
    srv = start_curve_server(tmp_path, clients=1)
    try:
        impostor, _ = init_keys(tmp_path / "impostor", "server")
        start = time.monotonic()
        with pytest.raises(EdgerunError, match="is not that device's public key"):
            edgerun.connect(srv.url, server_key=impostor, client_key=srv.client_keys[0], timeout=30)
        assert time.monotonic() - start < 10  # told at the handshake, not after the 30 s timeout
        with pytest.raises(EdgerunError, match="another security mechanism"):
            edgerun.connect(srv.url, "a-token-but-no-keys-at-all", timeout=10)
    finally:
        srv.stop()


def test_curve_with_a_token_as_second_factor(tmp_path: Path) -> None:
    srv = start_curve_server(tmp_path, clients=1, token=True)
    try:
        with pytest.raises(EdgerunError, match="refused the token"):
            srv.connect(timeout=10)  # the right key without the token
        assert srv.server_key is not None
        with edgerun.connect(srv.url, srv.token, server_key=srv.server_key, client_key=srv.client_keys[0]) as r:
            assert r.tensor(np.arange(3, dtype=np.int32)).numpy().tolist() == [0, 1, 2]
    finally:
        srv.stop()


def test_keys_are_files_written_0600_and_never_argv(tmp_path: Path) -> None:
    from edgerun.cli import build_parser, main
    from edgerun.remote.keys import KeyFileError, read_key_pair, read_public_key
    from edgerun.remote_server.server import DeviceServer

    assert main(["remote", "keys", "init", str(tmp_path / "k"), "--name", "dev"]) == 0
    public, secret = tmp_path / "k" / "dev.key", tmp_path / "k" / "dev.key_secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and (tmp_path / "k").stat().st_mode & 0o077 == 0
    assert read_key_pair(secret).public == read_public_key(public)
    assert "secret-key" not in public.read_text()
    assert main(["remote", "keys", "init", str(tmp_path / "k"), "--name", "dev"]) == 1  # never overwritten
    secret.chmod(0o644)
    with pytest.raises(KeyFileError, match=r"accessible by others .* chmod 600"):
        read_key_pair(secret)
    # Secrets are files: `serve` has no option that takes a token or a key itself.
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]  # type: ignore[union-attr]
    options = {o for a in serve._actions for o in a.option_strings}
    assert {"--token-file", "--curve-secret", "--curve-allow"} <= options
    assert not {"--token", "--key", "--secret"} & options
    # A token-only server is plaintext: not beyond loopback unless asked for.
    with pytest.raises(EdgerunError, match="without CURVE would send the token"):
        DeviceServer("t" * 32, host="0.0.0.0")


def test_curve_keys_from_the_environment_for_the_remote_backend(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    srv = start_curve_server(tmp_path, clients=1)
    try:
        monkeypatch.delenv("EDGERUN_TOKEN", raising=False)
        monkeypatch.setenv("EDGERUN_SERVER_KEY", str(srv.server_key))
        monkeypatch.setenv("EDGERUN_CLIENT_KEY", str(srv.client_keys[0]))
        backend = f"remote:{srv.address}"
        m = edgerun.load(_relu((4,)), backends=[backend])
        assert {p.backend for p in m.partitions} == {backend}
        np.testing.assert_array_equal(m(np.float32([-1, 2, -3, 4])), [0, 2, 0, 4])
    finally:
        srv.stop()
