"""Backend settings chosen per program: the tuned winner timed again with each open setting changed.

Calibration picks a device-wide value for each of a backend's `tunable_settings` (ONNX Runtime's pool-thread
spinning, MNN's thread count) from micro-benchmarks, and those proved a poor guide: at idle they gained
0.6-2x each with spinning from run to run and left it off in some calibrations and on in others, while on
real programs spinning won by 8-17% (MobileNetV2 5.40 -> 5.00 ms, ShuffleNetV2
3.75 -> 3.29, the MLP 35 -> 29 us, SmolLM2's decode 102 -> 110 tokens/s; load 0.1-1.5). So the
first auto load of a program, when its measuring budget is not spent, also loads the winner once per open
setting with that setting changed, times both in interleaved rounds (timing.py), and keeps the change only
if it wins by SETTING_GAIN (spinning costs every other process a core). The choice is cached beside the
tuned placement, per (device, program), and applied around the load of the cached winner.

Settings live on the shared backend instances (compile reads them), so they are applied for the duration of
one load and restored after; the sessions a load built keep what they were built with.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.backends.base import Backend
from edgerun.runtime import LoadedProgram
from edgerun.search.calibrate import SETTING_GAIN
from edgerun.search.fingerprint import cache_dir, device_fingerprint, read_json, write_json
from edgerun.search.timing import steady_seconds
from edgerun.search.tune import busy_after_call_s, warm_up_seconds

Settings = dict[str, dict[str, Any]]  # backend name -> {setting: value}


def settings_path(program_key: str) -> Path:
    return cache_dir() / "tuned" / device_fingerprint() / f"{program_key}.settings.json"


def cached_settings(program_key: str) -> Settings | None:
    """The settings tuned for this program on this device, if any were."""
    data = read_json(settings_path(program_key))
    if not isinstance(data, dict) or not isinstance(data.get("settings"), dict):
        return None
    return {str(b): dict(v) for b, v in data["settings"].items() if isinstance(v, dict)}


@contextlib.contextmanager
def applied_settings(backends: Mapping[str, Backend], settings: Settings) -> Iterator[None]:
    """`settings` applied to the backends for the duration of the block, the previous values restored after.
    A setting the backend no longer leaves open (the user fixed it since) is skipped."""
    restore: list[tuple[Backend, dict[str, Any]]] = []
    try:
        for name, chosen in settings.items():
            backend = backends.get(name)
            if backend is None:
                continue
            open_now = backend.tunable_settings()
            usable = {k: v for k, v in chosen.items() if k in open_now}
            if usable:
                restore.append((backend, {k: open_now[k][0] for k in usable}))
                backend.apply_settings(usable)
        yield
    finally:
        for backend, before in reversed(restore):
            backend.apply_settings(before)


def tune_settings(placement: Mapping[str, str], loaded: LoadedProgram, inputs: list[np.ndarray],
                  loader: Callable[[Mapping[str, str]], LoadedProgram], backends: Mapping[str, Backend],
                  program_key: str, deadline: float) -> tuple[Settings, LoadedProgram]:
    """The settings that beat the current ones on this program, and the winner loaded with them.

    Each open setting of each backend the placement uses is tried alone, in turn, while time is left before
    `deadline`; the result is cached (an empty dict too: "the current values won") unless time ran out."""
    settings: Settings = {}
    finished = True
    for name in sorted(set(placement.values())):
        backend = backends.get(name)
        if backend is None:
            continue
        for setting, values in backend.tunable_settings().items():
            if len(values) < 2:
                continue
            if time.perf_counter() >= deadline:
                finished = False
                break
            trial = {b: dict(v) for b, v in settings.items()}  # what won so far, and this change
            trial.setdefault(name, {})[setting] = values[1]
            with applied_settings(backends, trial):
                other = loader(placement)
            runs = {"current": functools.partial(loaded.run, inputs), "changed": functools.partial(other.run, inputs)}
            busy = {"current": busy_after_call_s(loaded), "changed": busy_after_call_s(other)}
            times = steady_seconds(runs, busy, {k: warm_up_seconds(r) for k, r in runs.items()}, deadline)
            if times["current"] >= SETTING_GAIN * times["changed"]:
                settings.setdefault(name, {})[setting] = values[1]
                loaded = other
            del other, runs
    if finished:
        write_json(settings_path(program_key), {"settings": settings})
    return settings, loaded
