"""How busy the machine is with other processes, now: what a measurement taken now is worth.

Calibration and the first-load tuning are cached for good; taken while other processes kept cores busy,
they describe that moment, not the machine (real models ran 1.11-1.64x ONNX Runtime's time until the cache
was deleted by hand). So each records how busy the machine was (`other_cpu_busy`), and one taken busy is
taken again on a load that finds the machine quiet (`worth_retaking`); one taken quiet costs no probe.

The probe reads Linux's /proc/stat and /proc/self/stat twice, WINDOW_S apart: the share of all cores' time
spent running anything but this process. Elsewhere, or with $EDGERUN_PROBE_MACHINE_LOAD=0 (the test suite
sets it: on a shared CI machine a measurement would otherwise be retaken whenever the machine happened to
go quiet), it says nothing (None), and nothing is retaken.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

BusyProbe = Callable[[], float | None]  # share of the machine's cores other processes used just now

PROBE_ENV = "EDGERUN_PROBE_MACHINE_LOAD"
WINDOW_S = 0.1
# A measurement taken with other processes using at least this share of the cores counts as taken busy
# (two processes spinning a core each on a 2-core machine: about 1.0)...
BUSY = 0.25
# ...and is taken again when a load finds them using at most this share.
QUIET = 0.1


def other_cpu_busy(window_s: float = WINDOW_S, sleep: Callable[[float], None] = time.sleep) -> float | None:
    """The share (0-1) of all cores' time that processes other than this one used over `window_s`; None
    where /proc is not there to say, or $EDGERUN_PROBE_MACHINE_LOAD is 0."""
    if os.environ.get(PROBE_ENV) == "0":
        return None
    try:
        (busy0, total0), own0 = _cpu_ticks(), _own_ticks()
        sleep(window_s)
        (busy1, total1), own1 = _cpu_ticks(), _own_ticks()
    except (OSError, ValueError, IndexError):
        return None
    return min(max((busy1 - busy0 - (own1 - own0)) / (total1 - total0), 0.0), 1.0) if total1 > total0 else None


def worth_retaking(busy_then: object, probe: BusyProbe) -> bool:
    """Whether a measurement taken with `busy_then` of the cores busy (None: not recorded) should be taken
    again now: it was taken busy and the machine is quiet now. Only then is the machine probed."""
    if not isinstance(busy_then, (int, float)) or busy_then < BUSY:
        return False
    now = probe()
    return now is not None and now <= QUIET


def _cpu_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot, from /proc/stat's first line."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return total - idle, total


def _own_ticks() -> int:
    """This process's user + system clock ticks (its threads included), from /proc/self/stat."""
    with open(f"/proc/{os.getpid()}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of the line)
