"""Whether the device is idle and charging, reported in its profile at every check-in so a federated job
trains only on devices that are (the condition Gboard's deployment uses: training must not drain the
battery or slow what the user is doing).

On Linux the kernel's power-supply class says whether external power is connected: a mains or USB supply
that is `online`, or a battery whose `status` is Charging or Full. A machine with no battery at all runs on
mains and counts as charging. Idle is the one-minute load average per CPU below `IDLE_LOAD`. An app
embedding the agent knows better (screen off, the platform's idle mode) and passes its own reader.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

POWER_SUPPLY = Path("/sys/class/power_supply")
IDLE_LOAD = 0.5  # one-minute load average per CPU under which the device counts as idle


@dataclass(frozen=True)
class DeviceState:
    idle: bool
    charging: bool


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def on_external_power(power_supply: Path = POWER_SUPPLY) -> bool:
    """True when a mains or USB supply is online or a battery is charging or full; True with no battery."""
    supplies = sorted(power_supply.iterdir()) if power_supply.is_dir() else []
    batteries = [s for s in supplies if _read(s / "type") == "Battery"]
    if any(_read(s / "type") in ("Mains", "USB", "USB_C", "USB_PD") and _read(s / "online") == "1" for s in supplies):
        return True
    if any(_read(b / "status") in ("Charging", "Full") for b in batteries):
        return True
    return not batteries


def read_device_state(power_supply: Path = POWER_SUPPLY, loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
                      cpus: int | None = None) -> DeviceState:
    """This machine's state: idle by the load average, charging by the power-supply class."""
    per_cpu = loadavg()[0] / max(1, cpus or os.cpu_count() or 1)
    return DeviceState(idle=per_cpu < IDLE_LOAD, charging=on_external_power(power_supply))
