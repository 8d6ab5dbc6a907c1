"""Backend specs as the tools take them: a registered name, or `faulty:<bug>` for the fault-injection
test backend (edgerun/backends/faulty.py)."""

from __future__ import annotations

from edgerun.backends.base import Backend
from edgerun.backends.registry import get_backend


def backend_from_spec(spec: str | Backend) -> Backend:
    if isinstance(spec, Backend):
        return spec
    if spec.startswith("faulty:"):
        from edgerun.backends.faulty import FaultyBackend

        return FaultyBackend(spec.split(":", 1)[1])
    return get_backend(spec)


def backend_label(backend: Backend) -> str:
    bug = getattr(backend, "bug", None)
    return f"{backend.name}:{bug}" if bug is not None else backend.name
