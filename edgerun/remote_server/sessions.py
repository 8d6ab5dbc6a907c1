"""Per-client state on the device: uploaded programs and tensors, with quotas on count, bytes and idle time.

Bytes are what a client DECLARED, counted before anything is allocated: a tensor's `prod(shape) * itemsize`
(an `empty` tensor counts in full even though its zero pages cost nothing yet), a program's file bytes plus
its planned arena. Three budgets apply to every admission: the session's, its client's (all of that
client's sessions together) and the server's (all sessions). A client is what the handshake authenticated:
a CURVE public key or one line of the token file; one client may hold at most `max_sessions_per_client`.
"""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.runtime.arena_limit import available_memory_bytes, human_bytes


class SessionLimitError(EdgerunError):
    """A session would exceed its bounds (objects, bytes) or the server its session count."""


def default_total_bytes() -> int:
    """What all sessions together may declare: 75% of the memory available when the server starts."""
    return int(available_memory_bytes() * 0.75)


@dataclass(frozen=True)
class SessionLimits:
    max_sessions: int = 16
    max_sessions_per_client: int = 4  # so one client cannot hold every session
    max_objects: int = 10_000  # tensors + programs per session
    max_bytes: int = 4 << 30  # declared bytes per session: tensors, program files, arenas
    max_client_bytes: int = 8 << 30  # declared bytes of one client's sessions together
    max_total_bytes: int = field(default_factory=default_total_bytes)  # all sessions together
    idle_seconds: float = 600.0  # a session nobody touched for this long is dropped

    def to_json(self) -> dict[str, float]:
        return {"max_sessions": self.max_sessions, "max_sessions_per_client": self.max_sessions_per_client,
                "max_objects": self.max_objects, "max_session_bytes": self.max_bytes,
                "max_client_bytes": self.max_client_bytes, "max_total_bytes": self.max_total_bytes,
                "idle_seconds": self.idle_seconds}


@dataclass
class Session:
    sid: str
    client: str
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    programs: dict[str, Any] = field(default_factory=dict)  # name -> LoadedProgram
    program_bytes: dict[str, int] = field(default_factory=dict)  # name -> file bytes + arena bytes
    used: int = 0  # declared bytes held: tensors + program_bytes
    last_used: float = field(default_factory=time.monotonic)
    _ids: Any = field(default_factory=itertools.count)

    def nbytes(self) -> int:
        return self.used

    def objects(self) -> int:
        return len(self.tensors) + len(self.programs)


class SessionStore:
    def __init__(self, limits: SessionLimits) -> None:
        self.limits = limits
        self._sessions: dict[str, Session] = {}

    def open(self, client: str) -> Session:
        self.expire()
        mine = self.client_sessions(client)
        if mine >= self.limits.max_sessions_per_client:
            raise SessionLimitError(f"this client already holds {mine} sessions, the most one client may hold "
                                    f"(max_sessions_per_client={self.limits.max_sessions_per_client}); close one "
                                    f"(RemoteDevice.close) or wait {self.limits.idle_seconds:g} s for idle ones "
                                    "to expire")
        if len(self._sessions) >= self.limits.max_sessions:
            raise SessionLimitError(f"the device already holds {self.limits.max_sessions} sessions")
        s = Session(secrets.token_hex(16), client)
        self._sessions[s.sid] = s
        return s

    def get(self, sid: object, client: str) -> Session:
        s = self._sessions.get(sid) if isinstance(sid, str) else None
        if s is None or s.client != client:  # another client's session is as good as absent
            raise EdgerunError(f"no session {sid!r} on this device (closed, expired, or never opened)")
        s.last_used = time.monotonic()
        return s

    def close(self, sid: object, client: str) -> None:
        s = self._sessions.get(sid) if isinstance(sid, str) else None
        if s is not None and s.client == client:
            del self._sessions[s.sid]

    def expire(self) -> None:
        now = time.monotonic()
        for sid in [k for k, s in self._sessions.items() if now - s.last_used > self.limits.idle_seconds]:
            del self._sessions[sid]

    def __len__(self) -> int:
        return len(self._sessions)

    def client_sessions(self, client: str) -> int:
        return sum(1 for s in self._sessions.values() if s.client == client)

    def client_bytes(self, client: str) -> int:
        return sum(s.used for s in self._sessions.values() if s.client == client)

    def total_bytes(self) -> int:
        return sum(s.used for s in self._sessions.values())

    # -- quotas --------------------------------------------------------------------------------------
    def room(self, s: Session) -> int:
        """The most bytes `s` may still declare under all three budgets."""
        lim = self.limits
        return max(0, min(lim.max_bytes - s.used, lim.max_client_bytes - self.client_bytes(s.client),
                          lim.max_total_bytes - self.total_bytes()))

    def admit(self, s: Session, new_objects: int, new_bytes: int, freed_bytes: int = 0) -> None:
        """Refuse, before anything is allocated, what would take `s` past a bound (`freed_bytes`: what the
        admission replaces, e.g. an earlier program of the same name)."""
        lim = self.limits
        if s.objects() + new_objects > lim.max_objects:
            raise SessionLimitError(f"session would hold more than {lim.max_objects} objects")
        grow = new_bytes - freed_bytes
        for what, held, cap in (("this session", s.used, lim.max_bytes),
                                ("this client's sessions", self.client_bytes(s.client), lim.max_client_bytes),
                                ("the device's sessions", self.total_bytes(), lim.max_total_bytes)):
            if held + grow > cap:
                raise SessionLimitError(f"{what} would hold more than {cap:,} B ({human_bytes(cap)}): "
                                        f"they hold {held:,} B, the request declares {new_bytes:,} B")

    def store_tensor(self, s: Session, arr: np.ndarray) -> str:
        handle = f"t{next(s._ids)}"
        s.tensors[handle] = arr
        s.used += int(arr.nbytes)
        return handle

    def replace_tensor(self, s: Session, handle: str, arr: np.ndarray) -> None:
        """A writable copy of a tensor in place of its read-only received view: same declared bytes."""
        s.tensors[handle] = arr

    def free_tensor(self, s: Session, handle: object) -> None:
        arr = s.tensors.pop(handle, None) if isinstance(handle, str) else None
        if arr is not None:
            s.used -= int(arr.nbytes)

    def store_program(self, s: Session, name: str, program: Any, nbytes: int) -> None:
        self.free_program(s, name)
        s.programs[name] = program
        s.program_bytes[name] = nbytes
        s.used += nbytes

    def free_program(self, s: Session, name: object) -> None:
        if isinstance(name, str) and name in s.programs:
            del s.programs[name]
            s.used -= s.program_bytes.pop(name)

    def tensor(self, s: Session, handle: object) -> np.ndarray:
        arr = s.tensors.get(handle) if isinstance(handle, str) else None
        if arr is None:
            raise EdgerunError(f"no tensor {handle!r} in this session")
        return arr
