"""Which devices a release targets, and which release wins when several target the same device.

A targeting spec has one `kind` with `values`, plus optional `app_version` range and `os` filter:
    {"kind": "uniform" | "device_group" | "user_group" | "device", "values": [...],
     "app_version": {"min": "1.2", "max": "2.0"}, "os": ["android", "ios"]}
Precedence, most specific first: device > user_group > device_group > uniform; within a kind the
higher version wins. `app_version` bounds are inclusive min, exclusive max, compared numerically.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from edgerun.fleet.errors import FleetError

KINDS = ("uniform", "device_group", "user_group", "device")
PRECEDENCE = {kind: rank for rank, kind in enumerate(KINDS)}  # higher rank wins


@dataclass(frozen=True)
class DeviceProfile:
    """What a device says about itself on every check-in (and on any business request)."""

    device_id: str
    app_version: str = "0"
    os: str = ""
    device_groups: tuple[str, ...] = ()
    user_groups: tuple[str, ...] = ()
    tasks: dict[str, int] = field(default_factory=dict)
    idle: bool = False          # the device's word, at its last check-in (device_state.py)
    charging: bool = False

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceProfile:
        return cls(device_id=str(d["device_id"]), app_version=str(d.get("app_version", "0")),
                   os=str(d.get("os", "")), device_groups=tuple(d.get("device_groups", ())),
                   user_groups=tuple(d.get("user_groups", ())),
                   tasks={str(k): int(v) for k, v in d.get("tasks", {}).items()},
                   idle=bool(d.get("idle", False)), charging=bool(d.get("charging", False)))

    def as_dict(self) -> dict[str, Any]:
        return {"device_id": self.device_id, "app_version": self.app_version, "os": self.os,
                "device_groups": list(self.device_groups), "user_groups": list(self.user_groups),
                "tasks": dict(self.tasks), "idle": self.idle, "charging": self.charging}


def version_key(v: str) -> tuple[int, ...]:
    parts = []
    for piece in str(v).split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def validate_targeting(spec: dict[str, Any]) -> dict[str, Any]:
    kind = spec.get("kind", "uniform")
    if kind not in KINDS:
        raise FleetError(f"targeting kind must be one of {', '.join(KINDS)}, got {kind!r}")
    values = spec.get("values", [])
    if kind != "uniform" and not values:
        raise FleetError(f"targeting kind {kind!r} needs a non-empty 'values' list")
    return {"kind": kind, "values": list(values), "app_version": dict(spec.get("app_version", {})),
            "os": list(spec.get("os", []))}


def matches(spec: dict[str, Any], device: DeviceProfile) -> bool:
    rng = spec.get("app_version") or {}
    if "min" in rng and version_key(device.app_version) < version_key(rng["min"]):
        return False
    if "max" in rng and version_key(device.app_version) >= version_key(rng["max"]):
        return False
    if spec.get("os") and device.os not in spec["os"]:
        return False
    kind, values = spec.get("kind", "uniform"), spec.get("values", [])
    if kind == "uniform":
        return True
    if kind == "device":
        return device.device_id in values
    if kind == "device_group":
        return any(g in values for g in device.device_groups)
    return any(g in values for g in device.user_groups)


def precedence(spec: dict[str, Any]) -> int:
    return PRECEDENCE[spec.get("kind", "uniform")]


BUCKETS = 1_000_000  # gray-step granularity: 0.0001% of the fleet


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


def device_bucket(device_id: str) -> int:
    """A device's fixed place in [0, BUCKETS), stored with the device (an indexed column), so the devices a
    step covers are counted in SQL over a range of it instead of hashing every device in Python."""
    return _hash64(device_id) % BUCKETS


def release_offset(task: str, version: int) -> int:
    """Where a release's gray window starts on the bucket circle: each release exposes a different slice of
    the fleet first, so the same devices are not always the canaries."""
    return _hash64(f"{task}:{version}") % BUCKETS


def step_width(percent: float) -> int:
    return min(BUCKETS, max(0, round(percent * BUCKETS / 100.0)))


def in_step(bucket: int, offset: int, percent: float) -> bool:
    """Whether a device in `bucket` is in a release's `percent` step; a device in step 1% stays in at 5%."""
    return (bucket - offset) % BUCKETS < step_width(percent)


def step_ranges(offset: int, percent: float) -> list[tuple[int, int]]:
    """The half-open bucket ranges a release's `percent` step covers (two when its window wraps around)."""
    width = step_width(percent)
    if width == 0:
        return []
    if offset + width <= BUCKETS:
        return [(offset, offset + width)]
    return [(offset, BUCKETS), (0, offset + width - BUCKETS)]


def is_plain_uniform(spec: dict[str, Any]) -> bool:
    """Targeting every device whatever its profile says: a step's population is then a bare count."""
    return spec.get("kind", "uniform") == "uniform" and not spec.get("app_version") and not spec.get("os")
