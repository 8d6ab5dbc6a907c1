"""Host side of the remote runtime: drive a device's backends from Python as if they were local.

    remote = edgerun.connect("tcp://127.0.0.1:7000", token)
    remote.upload(program, name="f")
    x = remote.tensor(np_array)             # lives on the device
    y = remote.empty((1, 10), "float32")
    remote.function("f")(x, out=y)
    y.numpy()                               # fetch
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from edgerun.errors import EdgerunError, RemoteError
from edgerun.ir.dtypes import DType
from edgerun.remote.keys import KeyPair, read_key_pair, read_public_key
from edgerun.remote.wire import Limits, WireError, decode_header, decode_tensors, encode

DEFAULT_TIMEOUT_S = 60.0


_HANDSHAKE_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                     | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)


class RemoteDevice:
    """A session on a device. Authenticates in the ZeroMQ handshake: with CURVE when `server_key` (the
    server's public key file) and `client_key` (this client's secret key file) are given, else with the token
    as the PLAIN password. The token, when given, also travels in every request header."""

    def __init__(self, url: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S,
                 server_key: str | os.PathLike[str] | None = None,
                 client_key: str | os.PathLike[str] | None = None) -> None:
        self.url = endpoint(url)
        self.timeout = timeout
        self._token = token
        self._curve: tuple[bytes, KeyPair] | None = None
        if server_key is not None or client_key is not None:
            if server_key is None or client_key is None:
                raise EdgerunError("CURVE needs both the server's public key file and this client's secret key file")
            self._curve = (read_public_key(server_key), read_key_pair(client_key))
            self._server_key_file = str(server_key)
        elif not token:
            raise EdgerunError("connect needs a token or CURVE keys (server_key= and client_key=)")
        self._ctx = zmq.Context()
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # one request in flight per device object
        self.limits = Limits()
        try:
            info = self.request("hello")[0]
            self.info = info
            self.limits = Limits(**info["limits"])
            self.session: str = self.request("open_session")[0]["session"]
        except BaseException:
            self._reset()
            self._ctx.destroy(linger=0)  # every socket closed: term() would wait forever on one left open
            raise

    # -- transport -----------------------------------------------------------------------------------
    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.SNDTIMEO, max(1, int(self.timeout * 1000)))
            if self._curve is not None:
                server_public, mine = self._curve
                sock.setsockopt(zmq.CURVE_SERVERKEY, server_public)
                sock.setsockopt(zmq.CURVE_PUBLICKEY, mine.public)
                sock.setsockopt(zmq.CURVE_SECRETKEY, mine.secret)
            else:
                sock.setsockopt(zmq.PLAIN_USERNAME, b"edgerun")
                sock.setsockopt(zmq.PLAIN_PASSWORD, (self._token or "").encode())
            # Handshake events tell a refused key or token, or a wrong server key, apart from a dead server.
            self._monitor = sock.get_monitor_socket(_HANDSHAKE_EVENTS)
            self._sock = sock  # before connect, so a failed connect is still closed by _reset
            try:
                sock.connect(self.url)
            except zmq.ZMQError as exc:
                self._reset()
                raise EdgerunError(f"cannot connect to {self.url}: {exc} (expected tcp://HOST:PORT)") from None
        return self._sock

    def _reset(self) -> None:
        # After a timeout the socket may still deliver a stale reply; a fresh socket never does.
        if self._sock is not None:
            self._sock.disable_monitor()
            if self._monitor is not None:
                self._monitor.close(0)
                self._monitor = None
            self._sock.close(0)
            self._sock = None

    def _handshake_failure(self) -> str | None:
        """The reason a handshake failed, from the monitor's pending events (None: no failure seen)."""
        assert self._monitor is not None
        while self._monitor.poll(0):
            event = recv_monitor_message(self._monitor)
            kind, value = int(event["event"]), int(event["value"])
            if kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                if self._curve is not None:
                    return (f"the remote device at {self.url} refused this client's CURVE key "
                            f"{self._curve[1].public.decode()} (it is not in the device's --curve-allow list)")
                return f"the remote device at {self.url} refused the token"
            if kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
                mine = "CURVE" if self._curve is not None else "a token (no CURVE keys)"
                return (f"the remote device at {self.url} uses another security mechanism than this client's "
                        f"{mine}: give both sides CURVE keys, or neither")
            if kind in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL):
                if self._curve is not None:
                    return (f"the CURVE handshake with {self.url} failed: the server key in "
                            f"{self._server_key_file} is not that device's public key")
                return (f"the remote device at {self.url} closed the handshake: it probably uses another security "
                        "mechanism (CURVE: connect with server_key= and client_key=)")
        return None

    def request(self, method: str, args: dict[str, Any] | None = None,
                tensors: Sequence[np.ndarray] = (), timeout: float | None = None) -> tuple[dict[str, Any], list[np.ndarray]]:
        """Send one request, wait for its reply; RemoteError for device-side failures."""
        req_id = next(self._ids)
        body = dict(args or {})
        if method not in ("hello", "open_session"):
            body.setdefault("session", self.session)
        header: dict[str, Any] = {"id": req_id, "method": method, "args": body}
        if self._token:
            header["token"] = self._token
        frames = encode(header, list(tensors))
        size = sum(len(f) for f in frames)
        if size > self.limits.max_message_bytes:
            raise EdgerunError(f"message of {size} bytes exceeds the device's limit of "
                               f"{self.limits.max_message_bytes}")
        wait = self.timeout if timeout is None else timeout
        with self._lock:
            sock = self._socket()
            try:
                # Bounded: after a refused handshake libzmq drops the connection and a send finds no peer.
                sock.send_multipart(frames, copy=False)
            except zmq.Again:
                failure = self._handshake_failure()
                self._reset()
                raise EdgerunError(failure or f"the remote device at {self.url} did not take {method!r} within "
                                              f"{self.timeout:g} s (is the server running?)") from None
            poller = zmq.Poller()
            poller.register(sock, zmq.POLLIN)
            poller.register(self._monitor, zmq.POLLIN)
            deadline = time.monotonic() + wait
            while True:
                ready = dict(poller.poll(max(0, int((deadline - time.monotonic()) * 1000))))
                failure = self._handshake_failure() if self._monitor in ready else None
                if failure is not None:
                    self._reset()
                    raise EdgerunError(failure)
                if sock not in ready:
                    if time.monotonic() < deadline:
                        continue
                    self._reset()
                    raise EdgerunError(f"the remote device at {self.url} did not answer {method!r} within "
                                       f"{wait:g} s (is the server running? raise timeout= for long calls)")
                reply = sock.recv_multipart(copy=False)
                try:
                    head = decode_header(reply[0].buffer)
                except WireError as exc:
                    raise EdgerunError(f"malformed reply from {self.url}: {exc}") from None
                if head.get("id") == req_id:
                    break  # replies to requests that timed out earlier are skipped
        if not head.get("ok"):
            err = head.get("error") or {}
            kind = err.get("type", "Error")
            if kind == "Unauthorized":
                raise EdgerunError(f"the remote device at {self.url} refused the token")
            raise RemoteError(f"{kind} on {self.url}: {err.get('message', '')}", remote_type=kind,
                              remote_traceback=err.get("traceback", ""))
        return head.get("result") or {}, decode_tensors(head, reply[1:], Limits(1 << 62, 1 << 62))

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(EdgerunError):
                self.request("close_session", timeout=2.0)
        with self._lock:
            self._reset()
        self._ctx.destroy(linger=0)

    def __enter__(self) -> RemoteDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the API (TAPML Fig. 6, in our terms) --------------------------------------------------------
    def upload(self, program: Any, name: str | None = None, backends: Sequence[str] | None = None) -> str:
        """Send a program (a Program or a path to a program file); compiled on the device. Returns its name."""
        from edgerun.program import Program

        if isinstance(program, str | os.PathLike):
            data = Path(program).read_bytes()
            default = Path(program).stem
        elif isinstance(program, Program):
            data = program.to_bytes()
            default = str(program.metadata.get("name") or program.program_hash()[:12])
        else:
            raise EdgerunError(f"upload takes a Program or a program file path, not {type(program).__name__}")
        name = name or default
        args: dict[str, Any] = {"name": name}
        if backends is not None:
            args["backends"] = list(backends)
        self.request("upload", args, [np.frombuffer(data, dtype=np.uint8)])
        return name

    def tensor(self, array: np.ndarray) -> RemoteTensor:
        arr = np.asarray(array)
        (handle,) = self.request("put", {}, [arr])[0]["handles"]
        return RemoteTensor(self, handle, arr.shape, DType.of(arr))

    def empty(self, shape: Sequence[int], dtype: str | DType = "float32") -> RemoteTensor:
        dt = DType(dtype)
        handle = self.request("empty", {"shape": [int(d) for d in shape], "dtype": dt.value})[0]["handle"]
        return RemoteTensor(self, handle, tuple(int(d) for d in shape), dt)

    def function(self, name: str) -> RemoteFunction:
        return RemoteFunction(self, name)


class RemoteTensor:
    """A tensor that lives on the device. `.numpy()` fetches it."""

    def __init__(self, device: RemoteDevice, handle: str, shape: tuple[int, ...], dtype: DType) -> None:
        self.device, self.handle, self.shape, self.dtype = device, handle, tuple(shape), dtype

    def numpy(self) -> np.ndarray:
        (arr,) = self.device.request("get", {"handles": [self.handle]})[1]
        return arr.copy()

    def free(self) -> None:
        self.device.request("free", {"handles": [self.handle]})

    def __repr__(self) -> str:
        return f"RemoteTensor({self.handle}, {self.dtype.value}{list(self.shape)} on {self.device.url})"


class RemoteFunction:
    def __init__(self, device: RemoteDevice, name: str) -> None:
        self.device, self.name = device, name

    def __call__(self, *args: RemoteTensor | np.ndarray, out: RemoteTensor | Sequence[RemoteTensor] | None = None,
                 fetch: bool = False) -> Any:
        """Run on the device. Arguments are device tensors or numpy arrays (sent inline).

        With `out=`, results are written into those device tensors; with `fetch=True` they come back as numpy
        arrays in the same round trip; otherwise they stay on the device as new RemoteTensors.
        """
        refs: list[dict[str, Any]] = []
        inline: list[np.ndarray] = []
        for a in args:
            if isinstance(a, RemoteTensor):
                if a.device is not self.device:
                    raise EdgerunError("a RemoteTensor can only be passed to functions on its own device")
                refs.append({"handle": a.handle})
            else:
                refs.append({"inline": len(inline)})
                inline.append(np.asarray(a))
        body: dict[str, Any] = {"function": self.name, "args": refs, "fetch": fetch}
        outs = [out] if isinstance(out, RemoteTensor) else list(out) if out is not None else None
        if outs is not None:
            body["out"] = [o.handle for o in outs]
        result, tensors = self.device.request("call", body, inline)
        if outs is not None:
            return out
        if fetch:
            return tuple(t.copy() for t in tensors)
        return tuple(RemoteTensor(self.device, h, tuple(sp["shape"]), DType(sp["dtype"]))
                     for h, sp in zip(result["handles"], result["specs"]))


def endpoint(url: str) -> str:
    """The ZeroMQ endpoint of `url`: `tcp://HOST:PORT` as given, `HOST:PORT` with tcp:// added; any other
    scheme (http://, which users type, ws://, ipc://) is refused at once, naming what is expected."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "tcp", url
    host, colon, port = rest.rpartition(":")
    if scheme != "tcp" or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in rest:
        why = ": the remote runtime speaks ZeroMQ over TCP, not HTTP" if scheme.lower() in ("http", "https") else ""
        raise EdgerunError(f"edgerun.connect takes tcp://HOST:PORT (or HOST:PORT) with a port in 1..65535, "
                           f"got {url[:200]!r}{why}")
    return f"tcp://{rest}"


SERVER_KEY_ENV = "EDGERUN_SERVER_KEY"  # path of the device's public key file (NAME.key)
CLIENT_KEY_ENV = "EDGERUN_CLIENT_KEY"  # path of this client's secret key file (NAME.key_secret)


def connect(url: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S,
            server_key: str | os.PathLike[str] | None = None,
            client_key: str | os.PathLike[str] | None = None) -> RemoteDevice:
    """Connect to `edgerun serve`.

    The token comes from `token=` or EDGERUN_TOKEN; CURVE key files from `server_key=`/`client_key=` or
    EDGERUN_SERVER_KEY/EDGERUN_CLIENT_KEY (paths: keys never travel in argv or in the environment itself).
    """
    token = token or os.environ.get("EDGERUN_TOKEN")
    server_key = server_key or os.environ.get(SERVER_KEY_ENV) or None
    client_key = client_key or os.environ.get(CLIENT_KEY_ENV) or None
    if not token and server_key is None and client_key is None:
        raise EdgerunError("connect needs a token (token= or EDGERUN_TOKEN) or CURVE keys (server_key= and "
                           f"client_key=, or {SERVER_KEY_ENV} and {CLIENT_KEY_ENV})")
    return RemoteDevice(url, token, timeout=timeout, server_key=server_key, client_key=client_key)
