"""Backend settings chosen per program: the tuned winner timed again with each open setting changed.

Calibration's device-wide choice of each of a backend's `tunable_settings` (ONNX Runtime's pool-thread
spinning, MNN's thread count) proved a poor guide: it left spinning off at idle, where real programs ran
8-17% faster spinning (docs/backends.md has the figures). So the first auto load of a program, when its measuring budget is not spent, also loads the winner once per open
setting with that setting changed, times both in interleaved rounds (timing.py), and keeps the change only
if it wins by SETTING_GAIN (spinning costs every other process a core). The choice is cached in the
program's tuned entry (tune.py's one cache), and applied around the load of the cached winner. A first
load that ran out of time leaves them to the next load, which tunes them starting from the cached winner.

A load builds with its own copies of the backends that carry the chosen settings (`configured`,
Backend.with_settings): the shared instances are never changed, so loads with other settings, in this
thread or another, cannot see them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from edgerun.backends.base import Backend
from edgerun.search.calibrate import SETTING_GAIN
from edgerun.search.timing import Clock, steady_seconds, warm_up_seconds
from edgerun.search.tune import Trial, discard, read_tuned, update_tuned

Settings = dict[str, dict[str, Any]]  # backend name -> {setting: value}


def cached_settings(program_key: str) -> Settings | None:
    """The settings tuned for this program on this device, if any were."""
    data = read_tuned(program_key).get("settings")
    return {str(b): dict(v) for b, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else None


def configured(backends: Mapping[str, Backend], settings: Settings) -> dict[str, Backend]:
    """The backends with `settings` applied: copies where a setting changes (Backend.with_settings), the
    instances themselves elsewhere; a setting the backend no longer leaves open is skipped."""
    return {name: b.with_settings(settings.get(name, {})) for name, b in backends.items()}


SettingsLoader = Callable[[Mapping[str, str], Mapping[str, Backend]], Trial]  # (placement, backends) -> loaded


def tune_settings(placement: Mapping[str, str], loaded: Trial, inputs: list[np.ndarray],
                  loader: SettingsLoader, backends: Mapping[str, Backend],
                  program_key: str, deadline: float, *, clock: Clock = time.perf_counter) -> tuple[Settings, Trial]:
    """The settings that beat the current ones on this program, and the winner loaded with them.

    Each open setting of each backend the placement uses is tried alone, in turn, while time is left before
    `deadline`; the result is cached (an empty dict too: "the current values won") unless time ran out."""
    settings: Settings = {}
    finished = True
    for name in sorted(set(placement.values()) & set(backends)):
        for setting, values in backends[name].tunable_settings().items():
            if len(values) < 2:
                continue
            if clock() >= deadline:
                finished = False
                break
            trial = {b: dict(v) for b, v in settings.items()}  # what won so far, and this change
            trial.setdefault(name, {})[setting] = values[1]
            other = loader(placement, configured(backends, trial))
            runs = {"current": functools.partial(loaded.run, inputs), "changed": functools.partial(other.run, inputs)}
            busy = {"current": loaded.busy_after_call_s, "changed": other.busy_after_call_s}
            times = steady_seconds(runs, busy, {k: warm_up_seconds(r, clock=clock) for k, r in runs.items()},
                                   deadline, clock=clock)
            del runs
            if times["current"] >= SETTING_GAIN * times["changed"]:
                settings.setdefault(name, {})[setting] = values[1]
                loaded, other = other, loaded
            discard(other)  # the one that lost
    if finished:
        update_tuned(program_key, settings=settings)
    return settings, loaded
