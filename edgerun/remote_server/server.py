"""The device server: hosts the backends installed here and runs uploaded programs for authenticated clients.

Only the methods in `DeviceServer.METHODS` exist; a program arrives as a program file (no pickle) and runs
through registered backends, so no client can make the server run arbitrary Python.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
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
from edgerun.remote.keys import KeyPair
from edgerun.remote.wire import (
    MAX_RANK,
    Limits,
    WireError,
    decode_header,
    decode_tensors,
    encode,
    error_body,
)
from edgerun.remote_server.auth import ZAP_DOMAIN, FailedHandshakeLimiter, HandshakeAuthenticator
from edgerun.remote_server.sessions import Session, SessionLimitError, SessionLimits, SessionStore
from edgerun.runtime.arena_limit import ArenaLimitError, arena_limit, human_bytes

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
    """Serve this device's backends. Clients authenticate during the ZeroMQ handshake, before any of their
    messages is accepted (edgerun/remote/auth.py): with CURVE when `curve_secret` is given (encrypted; the
    client's key must be in `curve_allow`), else with a token as the PLAIN password. With CURVE, a token, when
    given, is a second factor every request header must carry."""

    def __init__(self, token: str | Sequence[str] | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 backends: Sequence[str] = ("reference",), limits: Limits | None = None,
                 session_limits: SessionLimits | None = None, curve_secret: KeyPair | None = None,
                 curve_allow: set[bytes] | None = None, allow_plaintext: bool = False,
                 allowed_programs: set[str] | None = None, handshake_burst: int = 10,
                 handshake_refill_s: float = 6.0) -> None:
        tokens = [token] if isinstance(token, str) else list(token or [])
        if any(len(t) < 16 for t in tokens):
            raise EdgerunError("the server token must be at least 16 characters")
        if curve_secret is None and not tokens:
            raise EdgerunError("the server needs a token (--token-file) or a CURVE key pair (--curve-secret)")
        if curve_secret is not None and not curve_allow:
            raise EdgerunError("a CURVE server needs the public keys of the clients it allows (--curve-allow)")
        if curve_secret is None and not _is_loopback(host) and not allow_plaintext:
            raise EdgerunError(f"serving on {host} without CURVE would send the token and every tensor in the "
                               "clear; give --curve-secret and --curve-allow (or --insecure-plaintext on a "
                               "network you trust)")
        self._tokens = [t.encode() for t in tokens]
        self.curve_public = curve_secret.public if curve_secret is not None else None
        self.backends = list(backends)
        self.limits = limits or Limits()
        self.sessions = SessionStore(session_limits or SessionLimits())
        self.stats = ServerStats()
        self._client = ""  # the authenticated client of the request being handled
        self._ctx = zmq.Context()
        # The ZAP handler must be bound before the socket accepts a connection.
        self._auth = HandshakeAuthenticator(self._ctx, tokens, curve_allow if curve_secret is not None else None,
                                            FailedHandshakeLimiter(handshake_burst, handshake_refill_s))
        # SHA-256 digests of the program files clients may upload (--allow-programs); None: any program.
        self.allowed_programs = allowed_programs
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        if curve_secret is not None:
            self._sock.setsockopt(zmq.CURVE_SERVER, 1)
            self._sock.setsockopt(zmq.CURVE_SECRETKEY, curve_secret.secret)
        else:
            self._sock.setsockopt(zmq.PLAIN_SERVER, 1)
        # A backstop, per FRAME (libzmq has no per-message bound): an authenticated peer's single frame can
        # never exceed the message limit; handle() then refuses a multipart message whose total exceeds it.
        # Unauthenticated peers never get this far: the handshake refuses them before any frame is read.
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
                # The name the handshake gave this peer (ZAP user id): a CURVE key or a token's line.
                client = str(frames[-1].get("User-Id") or "")
                try:
                    reply_header, reply_tensors = self.handle(body, client)
                except Exception as exc:  # a bug in handle() must not take the device down
                    log.exception("request handling failed")
                    reply_header, reply_tensors = error_body("InternalError", str(exc)), []
                try:
                    self._sock.send_multipart([identity, *encode(reply_header, reply_tensors)], copy=False)
                except (zmq.ZMQError, WireError) as exc:  # the peer left, or the reply itself is too big
                    log.warning("could not send reply: %s", exc)
        finally:
            self._sock.close(0)
            self._auth.stop()
            self._ctx.term()

    def stop(self) -> None:
        self._stop.set()

    def handle(self, body: list[Any], client: str = "") -> Reply:
        """One authenticated peer's request frames in, the reply out. Never raises: every failure becomes an
        error reply."""
        self.stats.requests += 1
        self._client = client
        req_id: object = None
        try:
            if not body:
                raise WireError("empty message")
            size = sum(len(f) for f in body)
            if size > self.limits.max_message_bytes:  # the whole multipart message, as documented
                raise WireError(f"message of {size} bytes exceeds the limit of {self.limits.max_message_bytes} "
                                "(--max-message-mb counts all frames together)")
            header = decode_header(body[0].buffer if hasattr(body[0], "buffer") else body[0])
            req_id = header.get("id")
            if self._tokens and not self._token_ok(header.get("token")):
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

    def _token_ok(self, token: object) -> bool:
        if not isinstance(token, str):
            return False
        got = token.encode()
        return any([hmac.compare_digest(got, t) for t in self._tokens])  # a list: no early exit

    # -- methods -------------------------------------------------------------------------------------
    def _session(self, args: dict[str, Any]) -> Session:
        return self.sessions.get(args.get("session"), self._client)

    def _hello(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        from edgerun import __version__
        from edgerun.backends.registry import get_backend

        ops = sorted(set().union(*(get_backend(b).supported for b in self.backends)))
        return {"edgerun": __version__, "backends": self.backends, "ops": ops, "limits": self.limits.to_json(),
                "quotas": self.sessions.limits.to_json(), "sessions": len(self.sessions),
                "client": {"sessions": self.sessions.client_sessions(self._client),
                           "bytes": self.sessions.client_bytes(self._client)},
                "stats": {"requests": self.stats.requests, "handshakes_accepted": self._auth.accepted,
                          "handshakes_refused": self._auth.refused, "total_bytes": self.sessions.total_bytes()},
                }, []

    def _open_session(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        return {"session": self.sessions.open(self._client).sid}, []

    def _close_session(self, args: dict[str, Any], tensors: list[np.ndarray]) -> Reply:
        self.sessions.close(args.get("session"), self._client)
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
        if self.allowed_programs is not None:
            digest = hashlib.sha256(tensors[0].data).hexdigest()
            if digest not in self.allowed_programs:
                raise EdgerunError(f"program sha256 {digest} is not one this device may run (--allow-programs)")
        file_bytes = tensors[0].nbytes
        replaced = s.program_bytes.get(name, 0)
        self.sessions.admit(s, 0 if name in s.programs else 1, file_bytes, freed_bytes=replaced)
        backends = args.get("backends") or self.backends
        if not isinstance(backends, list) or any(b not in self.backends for b in backends):
            raise EdgerunError(f"this device serves the backends {self.backends}, not {backends}")
        program = Program.from_bytes(tensors[0].tobytes())
        # The planned arena counts against the quotas too, and is refused BEFORE it is allocated.
        room = self.sessions.room(s) + replaced - file_bytes
        machine, _ = arena_limit()
        try:
            loaded = load(program, backends=backends, arena_limit=None if machine <= room else room)
        except ArenaLimitError as exc:
            if machine <= room:
                raise
            raise SessionLimitError(f"the program needs an arena of {exc.nbytes:,} B ({human_bytes(exc.nbytes)}), "
                                    f"more than the {room:,} B this session may still declare under its "
                                    "session, client and device quotas; nothing was allocated") from None
        self.sessions.store_program(s, name, loaded, file_bytes + loaded.arena_bytes)
        g = loaded.graph
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
        nbytes = math.prod(shape) * dt.itemsize  # exact: np.prod in int64 wraps around for hostile shapes
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
            self.sessions.free_tensor(s, h)
        for name in args.get("functions") or []:
            self.sessions.free_program(s, name)
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
                    dst = dst.copy()
                    self.sessions.replace_tensor(s, h, dst)
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


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _jsonable_id(v: object) -> bool:
    return v is None or (isinstance(v, int) and not isinstance(v, bool))
