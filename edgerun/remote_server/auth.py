"""Authentication during the ZeroMQ handshake (ZAP, RFC 27), before any message of a peer is accepted.

libzmq asks this handler about every new connection before the peer may send a single message frame; a
refused peer is disconnected with nothing buffered. Two mechanisms:

- CURVE (`--curve-secret` on the server): the connection is encrypted and authenticated; the client's public
  key must be in the allow list. The client is named by its key, `key:<z85>`.
- PLAIN (a token file alone): the token is the PLAIN password, compared in constant time with each token in
  the file (one client per line); the client is named `token:<line>`. PLAIN is not encrypted: the server
  refuses to serve it beyond loopback unless told to (`--insecure-plaintext`).
"""

from __future__ import annotations

import hmac
import logging
import threading
from collections.abc import Sequence

import zmq
from zmq.utils import z85

log = logging.getLogger("edgerun.remote")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by RFC 27: libzmq sends its requests here
ZAP_DOMAIN = b"edgerun"


class HandshakeAuthenticator:
    """A ZAP handler on its own thread, so a long call on the server never stalls a handshake."""

    def __init__(self, ctx: zmq.Context, tokens: Sequence[str], allowed_keys: set[bytes] | None) -> None:
        self._tokens = [t.encode() for t in tokens]
        self._allowed = {z85.decode(k) for k in allowed_keys} if allowed_keys is not None else None
        self.accepted = 0
        self.refused = 0
        self._stop = threading.Event()
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)
        self._thread = threading.Thread(target=self._loop, name="edgerun-zap", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._sock.poll(100):
                    continue
                request = self._sock.recv_multipart()
                self._sock.send_multipart(self._answer(request))
        finally:
            self._sock.close(0)

    def _answer(self, request: list[bytes]) -> list[bytes]:
        if len(request) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, domain, address, _identity, mechanism, *credentials = request
        user = self._check(domain, mechanism, credentials)
        if user is None:
            self.refused += 1
            log.warning("refused a %s handshake from %s", mechanism.decode(errors="replace"),
                        address.decode(errors="replace"))
            return [version, request_id, b"400", b"not authorised", b"", b""]
        self.accepted += 1
        return [version, request_id, b"200", b"OK", user.encode(), b""]

    def _check(self, domain: bytes, mechanism: bytes, credentials: list[bytes]) -> str | None:
        if domain != ZAP_DOMAIN:
            return None
        if mechanism == b"CURVE" and self._allowed is not None and len(credentials) == 1:
            key = credentials[0]
            if any(hmac.compare_digest(key, k) for k in self._allowed):
                return f"key:{z85.encode(key).decode()}"
            return None
        if mechanism == b"PLAIN" and self._allowed is None and len(credentials) == 2:
            password = credentials[1]
            # Compare with every token (no early exit), so timing says nothing about which one matched.
            matches = [hmac.compare_digest(password, t) for t in self._tokens]
            return f"token:{matches.index(True) + 1}" if any(matches) else None
        return None
