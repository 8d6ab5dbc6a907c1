"""`edgerun run | info | plan | bench` on a saved program, through the real command-line entry point."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from runtime_testkit import random_inputs, small_transformer_block

from edgerun.cli import main
from edgerun.oracle import interpret
from edgerun.passes.pipeline import optimize, records_to_json
from edgerun.program import Program


@pytest.fixture
def program_file(tmp_path: Path) -> Path:
    graph, records = optimize(small_transformer_block())
    path = tmp_path / "block.edgerun"
    Program(graph, {"name": "block", "passes": records_to_json(records)}).save(path)
    return path


def test_run_with_npz_inputs_writes_the_interpreters_outputs(program_file: Path, tmp_path: Path) -> None:
    program = Program.read(program_file)
    x = random_inputs(program.graph)[0]
    np.savez(tmp_path / "in.npz", **{program.graph.inputs[0]: x})
    assert main(["run", str(program_file), "--inputs", str(tmp_path / "in.npz"),
                 "--out", str(tmp_path / "out.npz")]) == 0
    with np.load(tmp_path / "out.npz") as out:
        assert out.files == program.graph.outputs
        for name, want in zip(program.graph.outputs, interpret(program.graph, [x])):
            np.testing.assert_array_equal(out[name], want)


def test_run_random_prints_outputs(program_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(program_file), "--random"]) == 0
    assert "float32[1, 8, 16]" in capsys.readouterr().out


def test_run_reports_bad_inputs_as_an_error(program_file: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    np.savez(tmp_path / "bad.npz", wrong=np.zeros(3, np.float32))
    assert main(["run", str(program_file), "--inputs", str(tmp_path / "bad.npz")]) == 1
    assert "unknown inputs ['wrong']" in capsys.readouterr().err


def test_info_reports_kinds_arena_and_passes(program_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(program_file), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert set(info["ops_by_kind"]) <= {"atomic", "raster", "composite"} and info["ops_by_kind"]["atomic"]
    assert info["arena_lower_bound_bytes"] <= info["arena_bytes"] <= info["arena_naive_bytes"]
    assert info["weights_bytes"] > 0 and info["passes"][0]["name"] == "decompose"
    assert main(["info", str(program_file)]) == 0
    text = capsys.readouterr().out
    assert "lower bound" in text and "naive sum" in text and "decompose" in text


def test_plan_prints_one_row_per_partition(program_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(program_file), "--runs", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["partition", "backend", "ops", "estimated", "ms", "profiled", "now", "ms", "ratio"]
    row = lines[2].split()
    assert row[0] == "p0" and row[1] == "reference" and float(row[4]) > 0
    assert lines[-1].startswith("total")


def test_plan_with_an_unknown_backend_names_it(program_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(program_file), "--backends", "nonesuch", "--no-measure"]) == 1
    assert "no backend named 'nonesuch'" in capsys.readouterr().err


def test_bench_reports_a_median(program_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(program_file), "--runs", "5", "--warmup", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["runs"] == 5 and 0 < result["p10_ms"] <= result["median_ms"] <= result["p90_ms"]
