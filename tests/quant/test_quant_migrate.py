"""`edgerun migrate QUANT --against FLOAT`: a quantized program's layers brought in one at a time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from small_cnn import small_cnn
from test_quant_flows import images, sqnr

import edgerun
from edgerun.devtools.programs import load_graph
from edgerun.devtools.quant_migrate import migrate_against_float
from edgerun.errors import EdgerunError
from edgerun.oracle import interpret


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("migrate")
    program = small_cnn()
    quantized = edgerun.quantize(program, "int8-static", calibration={"image": images(3, seed=1)})
    program.save(folder / "float.edgerun")
    quantized.save(folder / "int8.edgerun")
    return folder / "float.edgerun", folder / "int8.edgerun"


def test_each_layer_is_a_step_and_the_last_step_is_the_whole_quantized_program(programs: tuple[Path, Path]) -> None:
    float_path, int8_path = programs
    quantized, source = load_graph(str(int8_path)), load_graph(str(float_path))
    inputs = [{"image": images(1, seed=s)[0]} for s in (4, 5)]
    report = migrate_against_float(quantized, source, inputs, min_snr_db=10)
    # two convs (ReLU folded: their uint8 results stand for the relu values), then two linear layers
    assert [s.op for s in report.steps] == ["maximum", "maximum", "matmul", "matmul"], report.table()
    assert report.passed and report.layers == 4 and "migrated all 4" in report.summary()
    # layer by layer the outputs drift no better than before, and the last step is the quantized program
    model = [s.model_snr_db for s in report.steps]
    assert model[0] > model[-1]
    whole = min(sqnr(interpret(source.graph, [x["image"]])[0], interpret(quantized.graph, [x["image"]])[0])
                for x in inputs)
    assert model[-1] == pytest.approx(whole, abs=1e-6)
    assert all(np.isfinite(s.layer_snr_db) and 15 < s.layer_snr_db < 80 for s in report.steps)


def test_stops_at_the_first_step_below_the_threshold_and_names_it(programs: tuple[Path, Path]) -> None:
    float_path, int8_path = programs
    quantized, source = load_graph(str(int8_path)), load_graph(str(float_path))
    inputs = [{"image": images(1, seed=4)[0]}]
    full = migrate_against_float(quantized, source, inputs, min_snr_db=10)
    model = [s.model_snr_db for s in full.steps]
    k = model.index(min(model))  # the worst step; every earlier one stays above the threshold
    assert k > 0
    threshold = (min(model[:k]) + model[k]) / 2
    report = migrate_against_float(quantized, source, inputs, min_snr_db=threshold)
    assert len(report.steps) == k + 1 and report.failed is report.steps[k]
    assert f"FAILED at step {k + 1} of 4: quantizing {report.steps[k].layer!r}" in report.summary()


def test_refuses_a_float_program_as_the_quantized_side(programs: tuple[Path, Path]) -> None:
    float_path, _ = programs
    with pytest.raises(EdgerunError, match="not a quantized one"):
        migrate_against_float(load_graph(str(float_path)), load_graph(str(float_path)),
                              [{"image": images(1, 4)[0]}])


def test_cli_migrate_against(programs: tuple[Path, Path], tmp_path: Path) -> None:
    float_path, int8_path = programs
    np.savez(tmp_path / "x.npz", image=images(1, seed=4)[0])
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "edgerun", "migrate", str(int8_path), "--against", str(float_path),
           "--inputs", str(tmp_path / "x.npz"), "--min-snr", "10", "--report-dir", str(tmp_path / "r")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "alone dB" in out.stdout and "migrated all 4" in out.stdout
    assert json.loads((tmp_path / "r" / "migration.json").read_text())["passed"] is True
    strict = [*cmd[:-4], "--min-snr", "200", "--report-dir", str(tmp_path / "strict")]
    out = subprocess.run(strict, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 1 and "FAILED at step 1 of 4" in out.stdout
    assert json.loads((tmp_path / "strict" / "migration.json").read_text())["failed"] is not None


def test_cli_migrate_needs_a_backend_or_a_float_program(programs: tuple[Path, Path],
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from edgerun.cli import main
    float_path, _ = programs
    assert main(["migrate", str(float_path)]) == 1
    assert "--to BACKEND, or --against FLOAT_PROGRAM" in capsys.readouterr().err
