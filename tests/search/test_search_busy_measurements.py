"""A calibration or a tuned placement measured while other processes kept the machine busy is measured again
on the first load that finds it quiet, with no cache deleted by hand (edgerun/search/machine_load.py). The
machine's load is a scripted probe here and the measurements fakes, so every decision is exact."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from search_testkit import FakeClock, FakeEngines, chain, modelled_table

from edgerun.backends.base import Backend
from edgerun.backends.registry import get_backend
from edgerun.search import CACHE_ENV, search_placement
from edgerun.search.calibrate import BackendProfile, backend_config, load_profiles
from edgerun.search.machine_load import BUSY, QUIET, other_cpu_busy
from edgerun.search.tune import tune_placement

ORT, REF = "onnxruntime", "reference"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    return tmp_path


class Probe:
    """The machine's load, as the test scripts it; counts how often the search asked."""

    def __init__(self, value: float | None) -> None:
        self.value, self.asked = value, 0

    def __call__(self) -> float | None:
        self.asked += 1
        return self.value


class Calibration:
    """A measurement whose figures say how busy the machine was: a busy one measures a tenth of the rate."""

    def __init__(self, probe: Probe) -> None:
        self.probe, self.taken = probe, 0

    def __call__(self, backend: Backend) -> BackendProfile:
        self.taken += 1
        rate = 1e10 if (self.probe.value or 0.0) < BUSY else 1e9
        return BackendProfile(rate, rate, rate, 1e10, 1e-6, 1e-5 * self.taken, config=backend_config(backend))


def test_a_calibration_taken_busy_is_taken_again_on_the_first_quiet_load_and_then_kept() -> None:
    backend = get_backend("reference")
    probe = Probe(0.9)  # two other processes spinning a core each on two cores
    measure = Calibration(probe)
    busy = load_profiles([backend], measure=measure, busy=probe)["reference"]
    assert measure.taken == 1 and busy.gemm_flops_per_s == 1e9
    probe.value = 0.5  # still busy: the cached figures stand
    assert load_profiles([backend], measure=measure, busy=probe)["reference"] == busy and measure.taken == 1
    probe.value = QUIET  # quiet: measured again, and the quiet figures replace the busy ones
    quiet = load_profiles([backend], measure=measure, busy=probe)["reference"]
    assert measure.taken == 2 and quiet.gemm_flops_per_s == 1e10
    asked = probe.asked
    probe.value = 0.9  # a calibration taken quiet is never second-guessed, and the machine is not probed
    assert load_profiles([backend], measure=measure, busy=probe)["reference"] == quiet
    assert measure.taken == 2 and probe.asked == asked


def test_a_calibration_whose_load_was_not_recorded_is_kept() -> None:
    backend = get_backend("reference")
    probe = Probe(None)  # no /proc: nothing recorded
    measure = Calibration(probe)
    load_profiles([backend], measure=measure, busy=probe)
    probe.value = 0.0
    load_profiles([backend], measure=measure, busy=probe)
    assert measure.taken == 1


def test_a_placement_tuned_busy_is_measured_again_on_the_first_quiet_load() -> None:
    graph = chain()
    table = modelled_table(graph, {ORT: 1.0, REF: 1.1})
    best = search_placement(table)
    probe = Probe(0.9)
    # Busy, the reference looked faster (ORT's pool threads fought the other processes for the cores).
    engines = FakeEngines(FakeClock(), {ORT: 3e-4, REF: 1e-4})
    first, report, _ = tune_placement(graph, table, best, "busy", loader=engines, clock=engines.clock, busy=probe)
    assert report["source"] == "measured" and set(first.values()) == {REF}
    probe.value = 0.5
    again, report, _ = tune_placement(graph, table, best, "busy", loader=engines, clock=engines.clock, busy=probe)
    assert report["source"] == "cache" and again == first
    quiet = FakeEngines(FakeClock(), {ORT: 1e-5, REF: 1e-4})  # quiet: ORT is in fact 10x faster
    probe.value = 0.0
    placement, report, _ = tune_placement(graph, table, best, "busy", loader=quiet, clock=quiet.clock, busy=probe)
    assert report["source"] == "measured" and set(placement.values()) == {ORT} and quiet.loaded
    asked = probe.asked
    probe.value = 0.9
    kept, report, _ = tune_placement(graph, table, best, "busy", loader=quiet, clock=quiet.clock, busy=probe)
    assert report["source"] == "cache" and kept == placement and probe.asked == asked  # measured quiet: no probe


def test_the_probe_sees_other_processes_spinning_a_core_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """The real probe (Linux): one process spinning per core shows as busy; with the switch off it says
    nothing."""
    cores = os.cpu_count() or 1
    if not Path("/proc/stat").exists() or cores > 8:
        pytest.skip("Linux's /proc, and few enough cores to fill")
    monkeypatch.delenv("EDGERUN_PROBE_MACHINE_LOAD")
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.3)
        seen = other_cpu_busy(0.3)
    finally:
        for p in spinners:
            p.kill()
            p.wait()
    assert seen is not None and seen >= BUSY
    monkeypatch.setenv("EDGERUN_PROBE_MACHINE_LOAD", "0")
    assert other_cpu_busy(0.01) is None
