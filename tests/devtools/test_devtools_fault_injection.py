"""The fault-injection proof (TAPML's claim): for every injected bug, migrate names the faulty op; carved
tests on realistic inputs catch the input-dependent bugs that random-input unit tests miss."""

import json
import shlex
from pathlib import Path

import pytest
from devtools_testkit import write_proof_program

from edgerun.backends.faulty import BUGS, FaultyBackend
from edgerun.backends.registry import get_backend
from edgerun.cli import main
from edgerun.devtools.bundle import TestBundle
from edgerun.devtools.carve import carve
from edgerun.devtools.check import check_bundle
from edgerun.devtools.compare import Tolerances
from edgerun.devtools.fault_proof import FAULTY_OP, fault_row, proof_loaded, realistic_inputs
from edgerun.devtools.migrate import migrate
from edgerun.devtools.programs import LoadedGraph
from edgerun.devtools.random_tests import random_unit_tests

INPUT_DEPENDENT = {"tanh_nan", "exp_range", "sigmoid_range"}


@pytest.fixture(scope="module")
def setup() -> tuple[LoadedGraph, list, TestBundle, TestBundle]:
    loaded = proof_loaded()
    inputs = realistic_inputs()
    return loaded, inputs, carve(loaded, inputs), random_unit_tests(loaded.graph)


@pytest.mark.parametrize("bug", [b for b in BUGS if b != "none"])
def test_migrate_names_the_faulty_op(setup, bug: str) -> None:
    loaded, inputs, carved, random_bundle = setup
    row = fault_row(loaded, inputs, bug, carved, random_bundle)
    assert row.migrate_named == FAULTY_OP[bug]
    assert row.carved_caught and row.carved_failing_ops == [FAULTY_OP[bug]]
    # Random unit tests: blind to the input-dependent bugs, and they do catch the deterministic ones.
    assert row.random_caught == (bug not in INPUT_DEPENDENT)


def test_random_inputs_never_reach_the_trigger_but_real_inputs_do(setup) -> None:
    _, _, carved, random_bundle = setup
    for bug in INPUT_DEPENDENT:
        op = FAULTY_OP[bug]
        assert check_bundle(random_bundle, FaultyBackend(bug), ops=[op]).passed
        assert not check_bundle(carved, FaultyBackend(bug), ops=[op]).passed


def test_bugless_target_migrates_every_op(setup) -> None:
    loaded, inputs, carved, _ = setup
    report = migrate(loaded, inputs, carved, get_backend("reference"), FaultyBackend("none"))
    assert report.passed and report.moved == list(dict.fromkeys(n.op for n in loaded.graph.nodes))
    assert all(s.model_error is not None and s.model_error.max_abs == 0 for s in report.steps)


def test_model_check_catches_what_a_loose_op_tolerance_lets_through(setup) -> None:
    loaded, inputs, carved, _ = setup
    report = migrate(loaded, inputs, carved, get_backend("reference"), FaultyBackend("sigmoid_range"),
                     tolerances=Tolerances.parse(["float32=0.1,0"]))
    failed = report.failed
    assert failed is not None and failed.unit == "sigmoid" and failed.op_passed and failed.model_passed is False
    assert report.repro is not None and "inspect" in report.repro and "--op sigmoid" in report.repro


def test_migrate_by_node_names_the_node(setup) -> None:
    loaded, inputs, carved, _ = setup
    report = migrate(loaded, inputs, carved, get_backend("reference"), FaultyBackend("raster_stride"), by="node")
    failed = report.failed
    node = next(n for n in loaded.graph.nodes if n.name == failed.unit) if failed else None
    assert node is not None and node.op == "raster"
    # Every node before it moved, including the rasters that are plain reshapes (contiguous copies).
    assert len(report.moved) == [n.name for n in loaded.graph.nodes].index(node.name)


def test_cli_migrate_writes_reports_and_the_repro_command_reproduces(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    program, inputs = write_proof_program(tmp_path)
    rep = tmp_path / "rep"
    rc = main(["migrate", program, "--from", "reference", "--to", "faulty:exp_range", "--inputs", inputs[0],
               "--inputs", inputs[1], "--report-dir", str(rep)])
    assert rc == 1
    data = json.loads((rep / "migration.json").read_text())
    assert data["failed"] == "exp" and data["failed_stage"] == "op" and data["worst_case"].startswith("exp")
    assert "## Failure" in (rep / "migration.md").read_text()
    assert data["steps"][-1]["worst_case_error"]["nan"] + data["steps"][-1]["worst_case_error"]["inf"] >= 0
    assert all(s["model_error"]["max_abs"] == 0 for s in data["steps"][:-1])
    capsys.readouterr()
    argv = shlex.split(data["repro"])
    assert argv[:2] == ["edgerun", "check"]
    assert main(argv[1:]) == 1
    assert "FAIL exp" in capsys.readouterr().out


def test_migrate_refuses_a_bundle_carved_from_another_program(tmp_path: Path) -> None:
    program, inputs = write_proof_program(tmp_path)
    other = tmp_path / "other.erp"
    from edgerun.devtools.fault_proof import proof_model
    from edgerun.program import Program

    Program(graph=proof_model(seed=1)).save(other)
    assert main(["carve", str(other), "--inputs", inputs[0], "-o", str(tmp_path / "other.bundle")]) == 0
    assert main(["migrate", program, "--to", "faulty:none", "--inputs", inputs[0],
                 "--bundle", str(tmp_path / "other.bundle"), "--report-dir", str(tmp_path / "rep")]) == 1
    assert not (tmp_path / "rep" / "migration.json").exists()
