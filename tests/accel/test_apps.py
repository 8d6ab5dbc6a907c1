"""The seven applications: within 1% MAPE of float64 on the default dataset and on the seed's ranges."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from edgerun.accel.apps import APP_NAMES, metrics, run_app
from edgerun.accel.modelfile import read_model, write_model
from edgerun.errors import EdgerunError

SIZE = {"gemm": 40, "pagerank": 40, "hotspot3d": 16, "lud": 40, "gaussian": 24, "backprop": 40, "blackscholes": 12}


@pytest.mark.parametrize("name", APP_NAMES)
@pytest.mark.parametrize("value_range", [None, (-(2.0**31), 2.0**31)])
def test_app_within_one_percent(name, value_range):
    r = run_app(name, SIZE[name], value_range=value_range, seed=1)
    assert r["mape_percent"] < 1.0 and r["rmse_percent"] < 1.0
    assert r["device_model_s"] > 0 and r["instructions"] > 0 and r["wall_s"] > 0


def test_metrics_definition():
    m = metrics(np.array([1.1, 2.0, 0.0]), np.array([1.0, 2.0, 0.0]))
    assert m["mape_percent"] == pytest.approx(5.0)  # zeros of the reference are skipped
    assert m["rmse_percent"] == pytest.approx(np.sqrt(0.01 / 3) / 2.0 * 100)  # RMSE / range


def test_bad_app_inputs():
    with pytest.raises(EdgerunError, match="unknown app"):
        run_app("fft", 16)
    with pytest.raises(EdgerunError, match="overflow"):
        run_app("gemm", 16, value_range=(-(2.0**40), 2.0**40))
    with pytest.raises(EdgerunError, match="LO < HI"):
        run_app("gemm", 16, value_range=(3.0, 1.0))
    with pytest.raises(EdgerunError, match="size"):
        run_app("gemm", 1)


def test_cli_prints_and_writes_the_contract_keys(tmp_path):
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "edgerun", "accel", "app", "gemm", "--size", "16", "--devices", "2",
                           "--range=-2^15,2^15", "--seed", "3", "--json", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    for key in ("mape_percent", "rmse_percent", "device_model_s", "wall_s", "numpy_s"):
        assert isinstance(data[key], float)
    assert "MAPE" in proc.stdout and data["devices"] == 2


@pytest.mark.parametrize("argv,msg", [
    (["nope", "--size", "8"], "unknown app"),
    (["gemm", "--size", "8", "--range=-2^40,2^40"], "overflow"),
    (["gemm", "--size", "8", "--range", "1"], "--range wants"),
])
def test_cli_bad_input_is_one_line_and_nonzero(argv, msg):
    proc = subprocess.run([sys.executable, "-m", "edgerun", "accel", "app", *argv], capture_output=True, text=True)
    assert proc.returncode == 1
    assert msg in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_model_file_round_trip_and_damage():
    x = np.random.default_rng(0).uniform(-5, 5, (130, 7))
    blob = write_model(x)
    codes, f = read_model(blob)
    assert codes.shape == (130, 7) and np.abs(codes / f - x).max() <= 0.5 / f + 1e-9
    assert len(blob) == 120 + 256 * 128 + 20  # padded to whole 128 x 128 tiles
    with pytest.raises(EdgerunError):
        read_model(blob[:-3])
    with pytest.raises(EdgerunError):
        read_model(b"x" * 200)
