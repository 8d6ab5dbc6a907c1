"""The schema of task.json, checked by `task pack`, by the server on publish and by the agent on install.

A config that passes cannot crash the agent: every field has a type and a range, numbers are finite, the
nesting is bounded. Errors are FleetError naming the field (`task.json: limits.timeout_s must be ...`).
Unknown top-level keys are kept (forward compatibility; they never reach the container); unknown keys
inside `limits`, `schedule`, `run_once` and `isolation` are refused, since a misspelt limit would silently not apply.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from edgerun.fleet.errors import FleetError

TASK_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
MAX_CONFIG_BYTES = 1 << 20
MAX_JSON_DEPTH = 32
ISOLATION_LEVELS = ("rlimit-only", "cgroup", "bwrap+rlimit", "bwrap+cgroup")  # = sandbox.ISOLATION_LEVELS
# name: (type, minimum, maximum, default)
LIMITS: dict[str, tuple[type, float, float, float | int | None]] = {
    "timeout_s": (float, 0.01, 86400.0, 10.0),
    "memory_mb": (int, 16, 65536, 512),
    "processes": (int, 1, 4096, 32),
    "open_files": (int, 16, 65536, 256),
    "scratch_mb": (int, 1, 65536, 64),
    "cpu_s": (float, 1.0, 86400.0, None),
}
TARGETING_KINDS = ("uniform", "device_group", "user_group", "device")


def _err(field: str, must: str, got: Any) -> FleetError:
    return FleetError(f"task.json: {field} must be {must}, got {_show(got)}")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(field: str, value: Any, kind: type, lo: float, hi: float) -> float | int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _err(field, f"a number in [{lo:g}, {hi:g}]", value)
    if kind is int and not isinstance(value, int):
        raise _err(field, f"an integer in [{lo:g}, {hi:g}]", value)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise _err(field, f"a finite number in [{lo:g}, {hi:g}]", value)
    return value


def _object(field: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _err(field, "an object", value)
    return value


def _string_list(field: str, value: Any, max_items: int = 1000) -> list[str]:
    if not isinstance(value, list) or len(value) > max_items or not all(isinstance(v, str) for v in value):
        raise _err(field, f"a list of at most {max_items} strings", value)
    return value


def _only(field: str, obj: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(obj) - allowed)
    if extra:
        raise FleetError(f"task.json: {field} has unknown key(s) {extra}; allowed: {sorted(allowed)}")


def safe_entry(value: Any) -> str:
    if not isinstance(value, str) or not value.endswith(".py") or value.startswith("/") or \
            any(part in ("", ".", "..") for part in value.split("/")) or "\\" in value or "\x00" in value:
        raise _err("entry", "a relative path to a .py file inside the task folder", value)
    return value


def validate_task_config(config: Any) -> dict[str, Any]:
    """Check a task config (task.json, or a release manifest's `config`) and fill defaults; returns it.

    Raises FleetError naming the first bad field. The server calls this on publish; the agent on install.
    """
    config = _object("the top level", config)
    check_depth(config)
    name = config.get("name")
    if not isinstance(name, str) or not TASK_NAME.match(name):
        raise _err("name", f"a string matching {TASK_NAME.pattern}", name)
    version = config.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= 2**53:
        raise _err("version", "a positive integer", version)
    config["entry"] = safe_entry(config.get("entry", "main.py"))
    triggers = config.setdefault("triggers", [])
    if not isinstance(triggers, list) or len(triggers) > 256 or not all(isinstance(t, dict) for t in triggers):
        raise _err("triggers", "a list of at most 256 objects", triggers)
    schedule = config.get("schedule")
    if schedule is not None:
        schedule = _object("schedule", schedule)
        _only("schedule", schedule, {"every_s"})
        _number("schedule.every_s", schedule.get("every_s"), float, 0.0, 365 * 86400.0)
    run_once = config.get("run_once")  # run once when the version is activated (stream/agent_hooks.py)
    if run_once is not None:
        run_once = _object("run_once", run_once)
        _only("run_once", run_once, {"record_id"})
        record_id = run_once.get("record_id")
        if not isinstance(record_id, str) or not 0 < len(record_id) <= 200:
            raise _err("run_once.record_id", "a string of 1 to 200 characters", record_id)
    limits = _object("limits", config.get("limits", {}))
    _only("limits", limits, set(LIMITS))
    filled: dict[str, Any] = {}
    for key, (kind, lo, hi, default) in LIMITS.items():
        if key in limits:
            filled[key] = _number(f"limits.{key}", limits[key], kind, lo, hi)
        elif default is not None:
            filled[key] = default
    config["limits"] = filled
    network = config.setdefault("network", False)
    if not isinstance(network, bool):
        raise _err("network", "true or false", network)
    minimum = config.get("min_isolation")
    if minimum is not None and minimum not in ISOLATION_LEVELS:
        raise _err("min_isolation", f"one of {list(ISOLATION_LEVELS)}", minimum)
    targeting = _object("targeting", config.setdefault("targeting", {"kind": "uniform"}))
    if targeting.get("kind", "uniform") not in TARGETING_KINDS:
        raise _err("targeting.kind", f"one of {list(TARGETING_KINDS)}", targeting.get("kind"))
    _string_list("targeting.values", targeting.get("values", []), 100_000)
    _string_list("targeting.os", targeting.get("os", []))
    if "app_version" in targeting:
        bounds = _object("targeting.app_version", targeting["app_version"])
        _only("targeting.app_version", bounds, {"min", "max"})
        for k, v in bounds.items():
            if not isinstance(v, str) or not re.fullmatch(r"[0-9]+(\.[0-9]+)*", v):
                raise _err(f"targeting.app_version.{k}", "a dotted version string like '2.1'", v)
    if "simulation" in config:
        sim = _object("simulation", config["simulation"])
        if not isinstance(sim.get("inputs", []), list):
            raise _err("simulation.inputs", "a list", sim.get("inputs"))
    if "rollout" in config:
        _object("rollout", config["rollout"])
    return config


def check_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> None:
    """Refuse nesting deeper than `limit` without recursion (a deep document cannot blow the stack)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            raise FleetError(f"task.json: nested deeper than {limit} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)


def _refuse_constant(name: str) -> Any:
    raise FleetError(f"task.json: {name} is not a number JSON allows")


def parse_config_json(text: str | bytes, source: str = "task.json") -> Any:
    """json.loads with a size bound, NaN/Infinity refused and nesting checked before the parser recurses."""
    if len(text) > MAX_CONFIG_BYTES:
        raise FleetError(f"{source}: larger than {MAX_CONFIG_BYTES} bytes")
    raw = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
    depth = deepest = 0
    in_string = escaped = False
    for ch in raw:  # brackets outside strings; cheap next to the parse, and it never recurses
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_JSON_DEPTH:
                raise FleetError(f"{source}: nested deeper than {MAX_JSON_DEPTH} levels")
        elif ch in "]}":
            depth -= 1
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except ValueError as exc:
        raise FleetError(f"{source}: invalid JSON: {exc}") from exc


def config_to_json(config: dict[str, Any]) -> str:
    return json.dumps(config, indent=1, sort_keys=True, allow_nan=False)
