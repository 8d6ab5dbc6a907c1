"""`edgerun inspect QUANT --against FLOAT`: a quantized program compared with its float source value by value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from small_cnn import small_cnn
from test_quant_flows import images

import edgerun
from edgerun.devtools.programs import load_graph
from edgerun.devtools.quant_inspect import compare_quantized
from edgerun.errors import EdgerunError


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("inspect")
    program = small_cnn()
    quantized = edgerun.quantize(program, "int8-static", calibration={"image": images(3, seed=1)})
    program.save(folder / "float.edgerun")
    quantized.save(folder / "int8.edgerun")
    return folder / "float.edgerun", folder / "int8.edgerun"


def test_every_layer_and_the_output_are_compared_in_order(programs: tuple[Path, Path]) -> None:
    float_path, int8_path = programs
    x = {"image": images(1, seed=4)[0]}
    report = compare_quantized(load_graph(str(int8_path)), load_graph(str(float_path)), x, min_snr_db=20)
    names = [v.value for v in report.values]
    assert len(names) == len(set(names)) and [v.index for v in report.values] == sorted(v.index for v in report.values)
    # the folded conv+ReLU layers are compared through their uint8 values, the rest as float
    assert sum(v.via_uint8 for v in report.values) == 2 and report.output is not None
    assert report.output.value == load_graph(str(float_path)).graph.outputs[0]
    assert all(15 < v.snr_db < 80 for v in report.values), report.table()
    assert report.first_below is None and "every one at or above 20 dB" in report.summary()
    strict = compare_quantized(load_graph(str(int8_path)), load_graph(str(float_path)), x, min_snr_db=200)
    assert strict.first_below is strict.values[0] and "first below 200 dB" in strict.summary()


def test_cli_compares_and_refuses_a_float_program_as_the_quantized_side(programs: tuple[Path, Path],
                                                                        tmp_path: Path) -> None:
    float_path, int8_path = programs
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    cmd = [sys.executable, "-m", "edgerun", "inspect", str(int8_path), "--against", str(float_path),
           "--min-snr", "10", "--json", str(tmp_path / "r.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "SQNR dB" in out.stdout and (tmp_path / "r.json").exists()
    with pytest.raises(EdgerunError, match="not a quantized one"):
        compare_quantized(load_graph(str(float_path)), load_graph(str(float_path)), {"image": images(1, 4)[0]})
