"""Where the search keeps what it learns, keyed by what makes one machine differ from another.

A device fingerprint hashes the CPU model, the core count, the OS and machine type, and the versions of
Python and numpy: any of these changing invalidates calibrations and tuned placements. A backend's own
library version is part of its identity (`Backend.identity`), in its calibration's config and in the key of
a tuned placement, so the fingerprint names no backend. The cache lives under $EDGERUN_CACHE_DIR, else
~/.cache/edgerun.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

# One root for every on-disk cache (the backends' conversions live there too); re-exported for the search's users.
from edgerun.backends.conversion_cache import CACHE_ENV as CACHE_ENV
from edgerun.backends.conversion_cache import cache_dir as cache_dir


@functools.lru_cache(maxsize=1)
def device_description() -> dict[str, Any]:
    """The facts the fingerprint is made of (shown by `edgerun calibrate`); read once per process."""
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "affinity": _usable_cores(),
            "system": platform.system(), "machine": platform.machine(),
            "python": platform.python_version(), "numpy": np.__version__}


@functools.lru_cache(maxsize=1)
def device_fingerprint() -> str:
    return hashlib.sha256(json.dumps(device_description(), sort_keys=True).encode()).hexdigest()[:16]


def read_json(path: Path) -> Any | None:
    """The JSON at `path`, or None when it is missing or unreadable (a cache is never worth a crash)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, data: Any) -> None:
    """Write atomically, so a concurrent reader sees the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
