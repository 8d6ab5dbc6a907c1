"""Per-client state on the device: uploaded programs and tensors, with bounds on count, bytes and idle time."""

from __future__ import annotations

import itertools
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError


class SessionLimitError(EdgerunError):
    """A session would exceed its bounds (objects, bytes) or the server its session count."""


@dataclass(frozen=True)
class SessionLimits:
    max_sessions: int = 16
    max_objects: int = 10_000  # tensors + programs per session
    max_bytes: int = 4 << 30  # tensor bytes + program file bytes per session
    idle_seconds: float = 600.0  # a session nobody touched for this long is dropped


@dataclass
class Session:
    sid: str
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    programs: dict[str, Any] = field(default_factory=dict)  # name -> LoadedProgram
    program_bytes: dict[str, int] = field(default_factory=dict)
    last_used: float = field(default_factory=time.monotonic)
    _ids: Any = field(default_factory=itertools.count)

    def nbytes(self) -> int:
        return sum(int(t.nbytes) for t in self.tensors.values()) + sum(self.program_bytes.values())

    def objects(self) -> int:
        return len(self.tensors) + len(self.programs)


class SessionStore:
    def __init__(self, limits: SessionLimits) -> None:
        self.limits = limits
        self._sessions: dict[str, Session] = {}

    def open(self) -> Session:
        self.expire()
        if len(self._sessions) >= self.limits.max_sessions:
            raise SessionLimitError(f"the device already holds {self.limits.max_sessions} sessions")
        s = Session(secrets.token_hex(8))
        self._sessions[s.sid] = s
        return s

    def get(self, sid: object) -> Session:
        s = self._sessions.get(sid) if isinstance(sid, str) else None
        if s is None:
            raise EdgerunError(f"no session {sid!r} on this device (closed, expired, or never opened)")
        s.last_used = time.monotonic()
        return s

    def close(self, sid: object) -> None:
        if isinstance(sid, str):
            self._sessions.pop(sid, None)

    def expire(self) -> None:
        now = time.monotonic()
        for sid in [k for k, s in self._sessions.items() if now - s.last_used > self.limits.idle_seconds]:
            del self._sessions[sid]

    def __len__(self) -> int:
        return len(self._sessions)

    # -- objects -------------------------------------------------------------------------------------
    def admit(self, s: Session, new_objects: int, new_bytes: int) -> None:
        if s.objects() + new_objects > self.limits.max_objects:
            raise SessionLimitError(f"session would hold more than {self.limits.max_objects} objects")
        if s.nbytes() + new_bytes > self.limits.max_bytes:
            raise SessionLimitError(f"session would hold more than {self.limits.max_bytes} bytes "
                                    f"(has {s.nbytes()}, adding {new_bytes})")

    def store_tensor(self, s: Session, arr: np.ndarray) -> str:
        handle = f"t{next(s._ids)}"
        s.tensors[handle] = arr
        return handle

    def tensor(self, s: Session, handle: object) -> np.ndarray:
        arr = s.tensors.get(handle) if isinstance(handle, str) else None
        if arr is None:
            raise EdgerunError(f"no tensor {handle!r} in this session")
        return arr
