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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from edgerun.errors import EdgerunError, RemoteError
from edgerun.ir.dtypes import DType
from edgerun.remote.wire import Limits, WireError, decode_header, decode_tensors, encode

DEFAULT_TIMEOUT_S = 60.0


class RemoteDevice:
    def __init__(self, url: str, token: str, *, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        if not url.startswith("tcp://"):
            url = f"tcp://{url}"
        self.url = url
        self.timeout = timeout
        self._token = token
        self._ctx = zmq.Context()
        self._sock: zmq.Socket | None = None
        self._ids = itertools.count(1)
        self._lock = threading.Lock()  # one request in flight per device object
        self.limits = Limits()
        info = self.request("hello")[0]
        self.info = info
        self.limits = Limits(**info["limits"])
        self.session: str = self.request("open_session")[0]["session"]

    # -- transport -----------------------------------------------------------------------------------
    def _socket(self) -> zmq.Socket:
        if self._sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.url)
            self._sock = sock
        return self._sock

    def _reset(self) -> None:
        # After a timeout the socket may still deliver a stale reply; a fresh socket never does.
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None

    def request(self, method: str, args: dict[str, Any] | None = None,
                tensors: Sequence[np.ndarray] = (), timeout: float | None = None) -> tuple[dict[str, Any], list[np.ndarray]]:
        """Send one request, wait for its reply; RemoteError for device-side failures."""
        req_id = next(self._ids)
        body = dict(args or {})
        if method not in ("hello", "open_session"):
            body.setdefault("session", self.session)
        header = {"id": req_id, "token": self._token, "method": method, "args": body}
        frames = encode(header, list(tensors))
        size = sum(len(f) for f in frames)
        if size > self.limits.max_message_bytes:
            raise EdgerunError(f"message of {size} bytes exceeds the device's limit of "
                               f"{self.limits.max_message_bytes}")
        wait = self.timeout if timeout is None else timeout
        with self._lock:
            sock = self._socket()
            sock.send_multipart(frames, copy=False)
            deadline_ms = int(wait * 1000)
            while True:
                if not sock.poll(deadline_ms):
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
        self._reset()
        self._ctx.term()

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


def connect(url: str, token: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S) -> RemoteDevice:
    """Connect to `edgerun serve`. The token comes from `token=` or the EDGERUN_TOKEN environment variable."""
    token = token or os.environ.get("EDGERUN_TOKEN")
    if not token:
        raise EdgerunError("connect needs a token: pass token= or set EDGERUN_TOKEN")
    return RemoteDevice(url, token, timeout=timeout)
