"""Backend settings tuned per program (edgerun.search.settings_tune): the winner built again with a setting
changed, kept only if it measures SETTING_GAIN faster, cached per (device, program), and built with copies
of the backends that carry it (the shared instances never change). Which setting wins on this machine is a measurement; these tests pin the mechanism by
moving the bar (SETTING_GAIN) to where the outcome is certain."""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from search_testkit import small_conv_net

from edgerun.backends.onnxruntime import OnnxRuntimeBackend
from edgerun.oracle import interpret
from edgerun.runtime.loader import load_prepared
from edgerun.search import CACHE_ENV, settings_tune
from edgerun.search.settings_tune import cached_settings, configured, tune_settings
from edgerun.search.tune import synthetic_inputs, tuned_path


def _spinning(loaded) -> bool:  # type: ignore[no-untyped-def]
    (compiled,) = loaded.parts.compiled
    options = compiled.run.__self__.session.get_session_options()
    return options.get_session_config_entry("session.intra_op.allow_spinning") == "1"


def test_loads_in_two_threads_with_different_settings_each_build_with_their_own() -> None:
    g = small_conv_net(16, seed=4)
    shared = OnnxRuntimeBackend(threads=2, spin=None)
    shared.spin_setting, shared.spin = None, False
    placement = {n.name: "onnxruntime" for n in g.nodes}
    spinning, still = shared.with_settings({"spin": True}), shared.with_settings({"spin": False})
    assert still is shared and spinning is not shared and shared.spin is False
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(load_prepared, None, g, g, [b], placement=placement) for b in (spinning, still)]
        loaded = [f.result() for f in futures]
    assert [_spinning(m) for m in loaded] == [True, False] and shared.spin is False


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    g = small_conv_net(16, seed=4)
    ort = OnnxRuntimeBackend(threads=2, spin=None)
    ort.spin_setting, ort.spin = None, False  # calibration's value, open to tuning (whatever the environment says)
    backends = {"onnxruntime": ort}
    placement = {n.name: "onnxruntime" for n in g.nodes}

    def loader(candidate, using=backends):  # type: ignore[no-untyped-def]
        return load_prepared(None, g, g, list(using.values()), placement=dict(candidate))

    return g, ort, backends, placement, loader


def test_a_setting_that_wins_is_kept_cached_and_the_backend_restored(setup, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    g, ort, backends, placement, loader = setup
    monkeypatch.setattr(settings_tune, "SETTING_GAIN", 0.0)  # any measurement counts as a win
    current = loader(placement)
    assert not _spinning(current)
    settings, loaded = tune_settings(placement, current, synthetic_inputs(g), loader, backends, "prog",
                                     deadline=time.perf_counter() + 5.0)
    assert settings == {"onnxruntime": {"spin": True}}
    assert _spinning(loaded) and ort.spin is False  # built spinning; the shared backend as it was
    assert cached_settings("prog") == settings
    x = np.random.default_rng(0).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), interpret(g, [x])[0], rtol=1e-4, atol=1e-5)
    again = loader(placement, configured(backends, settings))  # the cached winner's load
    assert _spinning(again) and ort.spin is False


def test_a_setting_that_does_not_win_is_not_kept_and_running_out_of_time_caches_nothing(setup, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    g, _, backends, placement, loader = setup
    monkeypatch.setattr(settings_tune, "SETTING_GAIN", math.inf)
    current = loader(placement)
    settings, loaded = tune_settings(placement, current, synthetic_inputs(g), loader, backends, "kept",
                                     deadline=time.perf_counter() + 5.0)
    assert settings == {} and loaded is current and cached_settings("kept") == {}  # "the current values won"
    settings, loaded = tune_settings(placement, current, synthetic_inputs(g), loader, backends, "late",
                                     deadline=time.perf_counter() - 1.0)
    assert settings == {} and loaded is current
    assert cached_settings("late") is None and not tuned_path("late").exists()


def test_a_setting_the_user_fixed_is_not_tuned_or_overridden(setup) -> None:  # type: ignore[no-untyped-def]
    g, _, _, placement, _ = setup
    fixed = OnnxRuntimeBackend(threads=2, spin=False)
    assert fixed.tunable_settings() == {}
    mine = configured({"onnxruntime": fixed}, {"onnxruntime": {"spin": True}})  # a cached choice: skipped
    assert mine["onnxruntime"] is fixed and fixed.spin is False
    current = load_prepared(None, g, g, [fixed], placement=placement)
    settings, _ = tune_settings(placement, current, synthetic_inputs(g), lambda p, b: current, {"onnxruntime": fixed},
                                "fixed", deadline=time.perf_counter() + 5.0)
    assert settings == {}


@pytest.fixture
def shared_ort(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """The process's ONNX Runtime backend, with an empty tuning cache and any changed setting winning."""
    from edgerun.backends.registry import get_backend

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    shared = get_backend("onnxruntime")
    if shared.spin_setting is not None:
        pytest.skip("EDGERUN_ORT_SPIN fixed ORT's spinning for this process")
    monkeypatch.setattr(settings_tune, "SETTING_GAIN", 0.0)  # the changed value always wins
    return shared


def test_the_first_auto_load_tunes_the_setting_and_a_later_load_builds_with_it(shared_ort) -> None:  # type: ignore[no-untyped-def]
    from edgerun.search import load

    shared = shared_ort
    g = small_conv_net(16, seed=4)
    # tune=True: no budget, so a slow machine cannot run out of time before the setting is tried.
    first = load(g, backends="auto:onnxruntime", tune=True)  # calibrates, tunes the placement, then the setting
    from edgerun.search import load_profiles

    calibrated = load_profiles([shared])["onnxruntime"].settings["spin"]  # what calibration chose (cached)
    assert first.search.tuning["source"] == "measured"
    assert first.search.settings == {"onnxruntime": {"spin": not calibrated}} and _spinning(first) is not calibrated
    later = load(g, backends="auto:onnxruntime", tune=True)
    assert later.search.tuning["source"] == "cache" and later.search.settings == first.search.settings
    assert _spinning(later) is not calibrated and shared.spin is False  # built with it; the shared one untouched
    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(later(x), first(x))


def test_settings_a_first_load_had_no_time_for_are_tuned_on_the_next_load_from_the_cached_winner(
        shared_ort) -> None:  # type: ignore[no-untyped-def]
    from edgerun.search import load, load_profiles
    from edgerun.search.tune import read_tuned

    shared = shared_ort
    g = small_conv_net(16, seed=5)
    first = load(g, backends="auto:onnxruntime", tune=True)
    calibrated = load_profiles([shared])["onnxruntime"].settings["spin"]
    (path,) = tuned_path("*").parent.glob("*.json")
    entry = {k: v for k, v in read_tuned(path.stem).items() if k != "settings"}  # as if time had run out
    path.write_text(json.dumps(entry))
    later = load(g, backends="auto:onnxruntime", tune=True)
    assert later.search.tuning["source"] == "cache" and later.search.settings == {"onnxruntime": {"spin": not calibrated}}
    assert _spinning(later) is not calibrated and read_tuned(path.stem)["settings"] == later.search.settings
    third = load(g, backends="auto:onnxruntime", tune=True)
    assert third.search.settings == later.search.settings and _spinning(third) is not calibrated
    x = np.random.default_rng(1).standard_normal((1, 8, 16, 16)).astype(np.float32)
    np.testing.assert_array_equal(third(x), first(x))
