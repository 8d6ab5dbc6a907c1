"""Authentication during the ZeroMQ handshake (ZAP, RFC 27), before any message of a peer is accepted.

libzmq asks this handler about every new connection before the peer may send a single message frame; a
refused peer is disconnected with nothing buffered. Two mechanisms:

- CURVE (`--curve-secret` on the server): the connection is encrypted and authenticated; the client's public
  key must be in the allow list. The client is named by its key, `key:<z85>`.
- PLAIN (a token file alone): the token is the PLAIN password, compared in constant time with each token in
  the file (one client per line); the client is named `token:<line>`. PLAIN is not encrypted: the server
  refuses to serve it beyond loopback unless told to (`--insecure-plaintext`).

Failed handshakes are rate-limited per peer address (`FailedHandshakeLimiter`): a few may fail at once,
then one more attempt per `refill_s`; while a peer is over its budget every handshake from it is refused
unchecked, so a guess there cannot tell a right token from a wrong one.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time
from collections.abc import Callable, Sequence

import zmq
from zmq.utils import z85

log = logging.getLogger("edgerun.remote")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by RFC 27: libzmq sends its requests here
ZAP_DOMAIN = b"edgerun"


class FailedHandshakeLimiter:
    """A token bucket of failed handshakes per peer address: `burst` failures at once, then one more per
    `refill_s`. `clock` is injectable (tests advance it instead of waiting)."""

    MAX_PEERS = 100_000  # addresses remembered; beyond it the fullest buckets (least suspect) are forgotten

    def __init__(self, burst: int = 10, refill_s: float = 6.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.refill_s, self.clock = burst, refill_s, clock
        self._buckets: dict[str, tuple[float, float]] = {}  # address -> (tokens, at)
        self.throttled = 0  # handshakes refused unchecked

    def _tokens(self, address: str) -> float:
        tokens, at = self._buckets.get(address, (float(self.burst), self.clock()))
        return min(float(self.burst), tokens + (self.clock() - at) / self.refill_s)

    def allows(self, address: str) -> bool:
        """May this peer try a handshake now (has it a failure left to spend)?"""
        return self._tokens(address) >= 1.0

    def failed(self, address: str) -> None:
        self._buckets[address] = (self._tokens(address) - 1.0, self.clock())
        if len(self._buckets) > self.MAX_PEERS:
            for peer in sorted(self._buckets, key=self._tokens, reverse=True)[: self.MAX_PEERS // 10]:
                del self._buckets[peer]


class HandshakeAuthenticator:
    """A ZAP handler on its own thread, so a long call on the server never stalls a handshake."""

    def __init__(self, ctx: zmq.Context, tokens: Sequence[str], allowed_keys: set[bytes] | None,
                 limiter: FailedHandshakeLimiter | None = None) -> None:
        self._tokens = [t.encode() for t in tokens]
        self._allowed = {z85.decode(k) for k in allowed_keys} if allowed_keys is not None else None
        self.limiter = limiter or FailedHandshakeLimiter()
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
        peer = address.decode(errors="replace")
        if not self.limiter.allows(peer):
            self.refused += 1
            self.limiter.throttled += 1
            if self.limiter.throttled % 1000 == 1:  # a log line per thousand, not per guess
                log.warning("refusing handshakes from %s unchecked: too many failed (%d so far)", peer,
                            self.limiter.throttled)
            return [version, request_id, b"400", b"too many failed handshakes", b"", b""]
        user = self._check(domain, mechanism, credentials)
        if user is None:
            self.refused += 1
            self.limiter.failed(peer)
            log.warning("refused a %s handshake from %s", mechanism.decode(errors="replace"), peer)
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
