"""The device server: hosts the backends installed here and runs uploaded programs for token-holding clients.

Only the methods in `DeviceServer.METHODS` exist; a program arrives as a program file (no pickle) and runs
through registered backends, so no client can make the server run arbitrary Python.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq

from edgerun.errors import EdgerunError
from edgerun.ir.dtypes import DType
from edgerun.remote.sessions import Session, SessionLimits, SessionStore
from edgerun.remote.wire import (
    MAX_RANK,
    Limits,
    WireError,
    decode_header,
    decode_tensors,
    encode,
    error_body,
)

log = logging.getLogger("edgerun.remote")

Reply = tuple[dict[str, Any], list[np.ndarray]]


@dataclass
class ServerStats:
    requests: int = 0
    refused_unauthorized: int = 0
    bad_requests: int = 0
    errors: int = 0
    started: float = field(default_factory=time.time)


class DeviceServer:
    def __init__(self, token: str, *, host: str = "127.0.0.1", port: int = 0,
                 backends: Sequence[str] = ("reference",), limits: Limits | None = None,
                 session_limits: SessionLimits | None = None) -> None:
        if len(token) < 16:
            raise EdgerunError("the server token must be at least 16 characters")
        self._token = token.encode()
        self.backends = list(backends)
        self.limits = limits or Limits()
        self.sessions = SessionStore(session_limits or SessionLimits())
        self.stats = ServerStats()
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        # libzmq drops (and disconnects) a peer whose message exceeds this, before buffering it whole.
        self._sock.setsockopt(zmq.MAXMSGSIZE, self.limits.max_message_bytes)
        if port:
            self._sock.bind(f"tcp://{host}:{port}")
            self.port = port
        else:
            self.port = self._sock.bind_to_random_port(f"tcp://{host}")
        self.host = host
        self._stop = threading.Event()
        self.METHODS: dict[str, Callable[[dict[str, Any], list[np.ndarray]], Reply]] = {
            "hello": self._hello, "open_session": self._open_session, "close_session": self._close_session,
            "upload": self._upload, "put": self._put, "empty": self._empty, "get": self._get,
            "free": self._free, "call": self._call, "describe": self._describe,
        }

    @property
    def url(self) -> str:
        return f"tcp://{self.host}:{self.port}"

    # -- the loop ------------------------------------------------------------------------------------
    def serve_forever(self, poll_ms: int = 200) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if not poller.poll(poll_ms):
                    self.sessions.expire()
                    continue
                frames = self._sock.recv_multipart(copy=False)
                identity, body = frames[0], frames[1:]
                try:
                    reply_header, reply_tensors = self.handle(body)
                except Exception as exc:  # a bug in handle() must not take the device down
                    log.exception("request handling failed")
                    reply_header, reply_tensors = error_body("InternalError", str(exc)), []
                try:
                    self._sock.send_multipart([identity, *encode(reply_header, reply_tensors)], copy=False)
                except (zmq.ZMQError, WireError) as exc:  # the peer left, or the reply itself is too big
                    log.warning("could not send reply: %s", exc)
        finally:
            self._sock.close(0)
            self._ctx.term()

    def stop(self) -> None:
        self._stop.set()

    def handle(self, body: list[Any]) -> Reply:
        """One request's frames in, the reply out. Never raises: every failure becomes an error reply."""
        self.stats.requests += 1
        req_id: object = None
        try:
            if not body:
                raise WireError("empty message")
            header = decode_header(body[0].buffer if hasattr(body[0], "buffer") else body[0])
            req_id = header.get("id")
            token = header.get("token")
            if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self._token):
                self.stats.refused_unauthorized += 1
                return dict(error_body("Unauthorized", "missing or wrong token"), id=req_id), []
            name = header.get("method")
            method = self.METHODS.get(name) if isinstance(name, str) else None
            if method is None:
                raise WireError(f"unknown method {header.get('method')!r}; methods: {sorted(self.METHODS)}")
            args = header.get("args", {})
            if not isinstance(args, dict):
                raise WireError("'args' must be a JSON object")
            tensors = decode_tensors(header, body[1:], self.limits)
        except WireError as exc:
            self.stats.bad_requests += 1
            return dict(error_body("BadRequest", str(exc)), id=req_id if _jsonable_id(req_id) else None), []
        try:
            result, out = method(args, tensors)
            return {"id": req_id, "ok": True, "result": result}, out
        except Exception as exc:  # a device-side failure goes back to the client with its traceback
            self.stats.errors += 1
            return dict(error_body(type(exc).__name__, str(exc), traceback.format_exc()), id=req_id), []

    # -- methods -------------------------------------------------------------------------------------
    def _session(self, args: dict[str, Any]) -> Session:
        return self.sessions.get(args.get("session"))

    def _hello(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        from edgerun import __version__
        from edgerun.backends.registry import get_backend

        ops = sorted(set().union(*(get_backend(b).supported for b in self.backends)))
        return {"edgerun": __version__, "backends": self.backends, "ops": ops, "limits": self.limits.to_json(),
                "sessions": len(self.sessions)}, []

    def _open_session(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        return {"session": self.sessions.open().sid}, []

    def _close_session(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        self.sessions.close(args.get("session"))
        return {}, []

    def _upload(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        from edgerun.program import Program
        from edgerun.runtime import load

        s = self._session(args)
        name = args.get("name")
        if not isinstance(name, str) or not name or len(name) > 200:
            raise EdgerunError("upload needs a function name of 1 to 200 characters")
        if len(tensors) != 1 or tensors[0].dtype != np.uint8 or tensors[0].ndim != 1:
            raise EdgerunError("upload takes the program file as one uint8 tensor")
        self.sessions.admit(s, 0 if name in s.programs else 1, tensors[0].nbytes)
        backends = args.get("backends") or self.backends
        if not isinstance(backends, list) or any(b not in self.backends for b in backends):
            raise EdgerunError(f"this device serves the backends {self.backends}, not {backends}")
        program = Program.from_bytes(tensors[0].tobytes())
        s.programs[name] = load(program, backends=backends)
        s.program_bytes[name] = tensors[0].nbytes
        g = s.programs[name].graph
        return {"name": name, "inputs": [g.specs[i].to_json() for i in g.inputs],
                "outputs": [g.specs[o].to_json() for o in g.outputs]}, []

    def _describe(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        s = self._session(args)
        return {"functions": sorted(s.programs), "tensors": len(s.tensors), "bytes": s.nbytes()}, []

    def _put(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        s = self._session(args)
        self.sessions.admit(s, len(tensors), sum(t.nbytes for t in tensors))
        # Kept as read-only views of the received frames (no copy); `call(out=...)` copies one on first write.
        return {"handles": [self.sessions.store_tensor(s, t) for t in tensors]}, []

    def _empty(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        s = self._session(args)
        shape, dtype = args.get("shape"), args.get("dtype")
        if not isinstance(shape, list) or len(shape) > MAX_RANK or \
                not all(isinstance(d, int) and 0 <= d < 1 << 40 for d in shape):
            raise EdgerunError("empty needs a shape: a list of non-negative integers")
        dt = DType(str(dtype))
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if nbytes > self.limits.max_tensor_bytes:
            raise EdgerunError(f"{nbytes} bytes exceeds the tensor limit of {self.limits.max_tensor_bytes}")
        self.sessions.admit(s, 1, nbytes)
        return {"handle": self.sessions.store_tensor(s, np.zeros(shape, dt.np))}, []

    def _get(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        s = self._session(args)
        handles = args.get("handles")
        if not isinstance(handles, list):
            raise EdgerunError("get needs a list of handles")
        return {}, [self.sessions.tensor(s, h) for h in handles]

    def _free(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        s = self._session(args)
        for h in args.get("handles") or []:
            if isinstance(h, str):
                s.tensors.pop(h, None)
        for name in args.get("functions") or []:
            if isinstance(name, str):
                s.programs.pop(name, None)
                s.program_bytes.pop(name, None)
        return {}, []

    def _call(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        s = self._session(args)
        fn = s.programs.get(args.get("function"))  # type: ignore[arg-type]
        if fn is None:
            raise EdgerunError(f"no function {args.get('function')!r} uploaded in this session")
        refs = args.get("args")
        if not isinstance(refs, list):
            raise EdgerunError("call needs 'args': a list of {'handle': h} or {'inline': i}")
        inputs = [self._resolve(s, r, tensors) for r in refs]
        result = fn(*inputs)
        outs = list(result) if isinstance(result, tuple | list) else [result]
        out_handles = args.get("out")
        if out_handles is not None:
            if not isinstance(out_handles, list) or len(out_handles) != len(outs):
                raise EdgerunError(f"'out' must list {len(outs)} handles")
            for h, value in zip(out_handles, outs):
                dst = self.sessions.tensor(s, h)
                if not dst.flags.writeable:
                    dst = s.tensors[h] = dst.copy()
                if dst.shape != value.shape or dst.dtype != value.dtype:
                    raise EdgerunError(f"out tensor {h} is {dst.dtype}{list(dst.shape)}, "
                                       f"the result is {value.dtype}{list(value.shape)}")
                dst[...] = value
            return {"handles": out_handles}, []
        if args.get("fetch"):
            return {}, outs
        self.sessions.admit(s, len(outs), sum(o.nbytes for o in outs))
        return {"handles": [self.sessions.store_tensor(s, o) for o in outs],
                "specs": [{"shape": list(o.shape), "dtype": o.dtype.name} for o in outs]}, []

    def _resolve(self, s: Session, ref: object, tensors: list[np.ndarray]) -> np.ndarray:
        if isinstance(ref, dict) and "handle" in ref:
            return self.sessions.tensor(s, ref["handle"])
        if isinstance(ref, dict) and isinstance(ref.get("inline"), int) and 0 <= ref["inline"] < len(tensors):
            return tensors[ref["inline"]]
        raise EdgerunError(f"bad argument reference {ref!r}")


def _jsonable_id(v: object) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))
