"""edgerun: compile a model once, run it on any platform."""

from __future__ import annotations

from edgerun.errors import (
    BackendUnavailableError,
    EdgerunError,
    ProgramFormatError,
    UnsupportedOpError,
    VerificationError,
)

__version__ = "0.1.0"

__all__ = [
    "BackendUnavailableError",
    "EdgerunError",
    "ProgramFormatError",
    "UnsupportedOpError",
    "VerificationError",
    "__version__",
]
