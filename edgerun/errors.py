"""Every error edgerun raises on purpose derives from EdgerunError, so callers can catch ours apart from bugs."""

from __future__ import annotations


class EdgerunError(Exception):
    """Base class of every error edgerun raises on purpose."""


class UnsupportedOpError(EdgerunError):
    """An operator no frontend, pass or backend can handle; names the op and where it came from."""

    def __init__(self, op: str, *, module_path: str | None = None, source: str | None = None,
                 detail: str | None = None) -> None:
        parts = [f"unsupported operator {op!r}"]
        if module_path:
            parts.append(f"in module {module_path!r}")
        if source:
            parts.append(f"at {source}")
        msg = " ".join(parts)
        if detail:
            msg += f": {detail}"
        super().__init__(msg)
        self.op = op
        self.module_path = module_path
        self.source = source


class VerificationError(EdgerunError):
    """A graph breaks an IR invariant (types, shapes, unregistered op, dangling value)."""


class ProgramFormatError(EdgerunError):
    """A program file is truncated, corrupted, from an unknown version, or hostile."""


class BackendUnavailableError(EdgerunError):
    """A backend was asked for that is not installed; the message names the extra to install."""


class RemoteError(EdgerunError):
    """An exception raised on a remote device; carries the device's own traceback."""

    def __init__(self, message: str, *, remote_type: str = "", remote_traceback: str = "") -> None:
        text = message
        if remote_traceback:
            text += f"\n--- traceback on the device ---\n{remote_traceback.rstrip()}"
        super().__init__(text)
        self.remote_type = remote_type
        self.remote_traceback = remote_traceback
