"""Per-token and per-address rate limits: a token bucket per key, as pure ASGI middleware in front of the app.

A request spends one token from the bucket of its client address and one from the bucket of its bearer token
(whatever the token is: the limit is judged before any database look-up, so a flood of made-up tokens costs
only a hash), and is answered 429 with `Retry-After` when either is empty. Buckets live in a bounded cache
(`cachetools.TTLCache`): an idle key is forgotten once its bucket would be full again, and at most
`max_keys` keys are kept, so memory is bounded whatever the number of clients. Behind a load balancer the
address is the client's only when uvicorn trusts the balancer's X-Forwarded-For (`--forwarded-allow-ips`).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache


@dataclass(frozen=True)
class Rate:
    per_s: float  # tokens added a second; 0 turns the limit off
    burst: int    # bucket size: requests allowed at once after a quiet spell

    @classmethod
    def parse(cls, text: str) -> Rate:
        """`"20/s:200"` (20 a second, bursts of 200) or `"0"` (off)."""
        if text.strip() == "0":
            return cls(0.0, 0)
        try:
            rate, burst = text.split(":")
            per_s = float(rate.removesuffix("/s"))
            parsed = cls(per_s, int(burst))
        except ValueError:
            raise ValueError(f"rate {text!r}: expected N/s:BURST, e.g. 20/s:200, or 0 for none") from None
        if not (math.isfinite(per_s) and per_s > 0 and parsed.burst >= 1):
            raise ValueError(f"rate {text!r}: the rate must be positive and finite, the burst at least 1")
        return parsed


class Buckets:
    def __init__(self, rate: Rate, clock: Callable[[], float] = time.monotonic, max_keys: int = 100_000) -> None:
        self.rate, self.clock = rate, clock
        refill_s = rate.burst / rate.per_s if rate.per_s > 0 else 1.0
        self._state: TTLCache[str, tuple[float, float]] = TTLCache(max_keys, refill_s, timer=clock)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """0 when `key` may go on, else the seconds until its next token."""
        if self.rate.per_s <= 0:
            return 0.0
        now = self.clock()
        with self._lock:
            tokens, at = self._state.get(key, (float(self.rate.burst), now))
            tokens = min(float(self.rate.burst), tokens + (now - at) * self.rate.per_s)
            if tokens < 1.0:
                self._state[key] = (tokens, now)
                return (1.0 - tokens) / self.rate.per_s
            self._state[key] = (tokens - 1.0, now)
            return 0.0


class RateLimit:
    def __init__(self, app: Any, per_address: Rate, per_token: Rate, on_refused: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic, exempt: tuple[str, ...] = ("/v1/health", "/v1/ready",
                                                                                       "/metrics")) -> None:
        self.app, self.on_refused, self.exempt = app, on_refused, exempt
        self.by_address, self.by_token = Buckets(per_address, clock), Buckets(per_token, clock)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in self.exempt:
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        wait = self.by_address.take(client[0] if client else "")
        scope_name = "address"
        if not wait:
            auth = dict(scope["headers"]).get(b"authorization", b"")
            if auth:
                wait, scope_name = self.by_token.take(hashlib.sha256(auth).hexdigest()), "token"
        if not wait:
            await self.app(scope, receive, send)
            return
        self.on_refused(scope_name)
        body = json.dumps({"detail": f"rate limit per {scope_name}: retry in {wait:.1f} s"}).encode()
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                                (b"retry-after", str(max(1, math.ceil(wait))).encode())]})
        await send({"type": "http.response.body", "body": body})
