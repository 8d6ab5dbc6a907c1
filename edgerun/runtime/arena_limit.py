"""The arena budget: load() refuses a program whose planned arena is larger than this machine should give it.

A program file is small even when its graph implies a 12 TiB arena (shapes are just numbers), so the planned
size is checked BEFORE the arena is allocated: a clear error naming the bytes and the limit, never a numpy
MemoryError or an over-committed buffer that the OOM killer collects later.

The limit, first that applies: `load(..., arena_limit=N)`; the environment variable EDGERUN_MAX_ARENA_BYTES
(bytes, with an optional K/M/G/T suffix, powers of 1024); 75% of MemAvailable from /proc/meminfo (75% of
physical memory where /proc is missing).
"""

from __future__ import annotations

import os

from edgerun.errors import EdgerunError

ENV_VAR = "EDGERUN_MAX_ARENA_BYTES"
DEFAULT_FRACTION = 0.75
_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class ArenaLimitError(EdgerunError):
    """A program's arena is larger than the limit; nothing was allocated."""

    def __init__(self, nbytes: int, limit: int, source: str) -> None:
        super().__init__(f"the program needs an arena of {nbytes:,} B ({human_bytes(nbytes)}), above the limit "
                         f"of {limit:,} B ({human_bytes(limit)}, {source}); nothing was allocated")
        self.nbytes, self.limit, self.source = nbytes, limit, source


def available_memory_bytes() -> int:
    """MemAvailable from /proc/meminfo; physical memory where that is missing."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def parse_bytes(text: str) -> int:
    """'12G' -> 12 GiB; a plain number is bytes."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in _SUFFIXES and t[-1:] else ""
    try:
        value = float(t[:-1] if unit else t) * _SUFFIXES[unit]
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise EdgerunError(f"{text!r} is not a size in bytes (examples: 1073741824, 512M, 12G)")
    return int(value)


def arena_limit(limit: int | None = None) -> tuple[int, str]:
    """The limit that applies and where it came from (for the error message)."""
    if limit is not None:
        return int(limit), "the arena_limit argument"
    env = os.environ.get(ENV_VAR)
    if env:
        return parse_bytes(env), f"{ENV_VAR}={env}"
    return int(available_memory_bytes() * DEFAULT_FRACTION), "75% of this machine's available memory"


def check_arena_budget(nbytes: int, limit: int | None = None) -> None:
    """Raise ArenaLimitError when an arena of `nbytes` exceeds the limit (see the module docstring)."""
    cap, source = arena_limit(limit)
    if nbytes > cap:
        raise ArenaLimitError(nbytes, cap, source)


def human_bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
