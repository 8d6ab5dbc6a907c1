"""check: replay carved cases on a backend, per-op table, exit codes."""

from pathlib import Path

import pytest
from devtools_testkit import write_proof_program

from edgerun.backends.faulty import FaultyBackend
from edgerun.backends.registry import get_backend
from edgerun.cli import main
from edgerun.devtools.bundle import TestBundle
from edgerun.devtools.carve import carve
from edgerun.devtools.check import check_bundle
from edgerun.devtools.compare import Tolerances
from edgerun.devtools.fault_proof import proof_loaded, realistic_inputs


@pytest.fixture(scope="module")
def bundle() -> TestBundle:
    return carve(proof_loaded(), realistic_inputs())


def test_reference_and_bugless_faulty_pass_every_case(bundle: TestBundle) -> None:
    for backend in (get_backend("reference"), FaultyBackend("none")):
        report = check_bundle(bundle, backend)
        assert report.passed and len(report.results) == len(bundle)
        assert all(row.max_abs == 0 and row.max_ulp == 0 for row in report.rows())


def test_a_faulty_op_fails_only_its_own_rows(bundle: TestBundle) -> None:
    report = check_bundle(bundle, FaultyBackend("tanh_nan"))
    failing = {row.op for row in report.rows() if not row.ok}
    assert failing == {"tanh"}
    row = next(r for r in report.rows() if r.op == "tanh")
    assert row.nan_inf > 0 and row.worst_case.startswith("tanh")
    assert "FAIL" in report.table()


def test_tolerance_override_can_accept_a_small_error(bundle: TestBundle) -> None:
    strict = check_bundle(bundle, FaultyBackend("sigmoid_range"), ops=["sigmoid"])
    loose = check_bundle(bundle, FaultyBackend("sigmoid_range"), ops=["sigmoid"],
                         tolerances=Tolerances.parse(["float32=0.1,0"]))
    assert not strict.passed and loose.passed


def test_unsupported_node_is_a_failed_case_not_a_crash(bundle: TestBundle) -> None:
    class NoTanh(FaultyBackend):
        supported = {op: s for op, s in FaultyBackend.supported.items() if op != "tanh"}
    report = check_bundle(bundle, NoTanh(), ops=["tanh", "exp"])
    bad = report.failures
    assert {r.case.op for r in bad} == {"tanh"} and "does not support" in (bad[0].error or "")


def test_cli_carve_and_check_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program, inputs = write_proof_program(tmp_path)
    out = str(tmp_path / "tests.bundle")
    assert main(["carve", program, "--inputs", inputs[0], "--inputs", inputs[1], "-o", out]) == 0
    assert main(["check", out, "--backend", "reference"]) == 0
    assert main(["check", out, "--backend", "faulty:dequant_uint8", "--json", str(tmp_path / "c.json")]) == 1
    text = capsys.readouterr().out
    assert "max ULP" in text and "FAIL cast" in text
    assert main(["check", out, "--backend", "faulty:dequant_uint8", "--op", "tanh"]) == 0
    assert main(["check", out, "--backend", "no_such_backend"]) == 1


def test_faulty_backend_by_registry_name_reads_its_bug_from_the_environment(
        bundle: TestBundle, monkeypatch: pytest.MonkeyPatch) -> None:
    from edgerun.backends.registry import unregister_backend

    monkeypatch.setenv("EDGERUN_FAULT", "raster_stride")
    unregister_backend("faulty")  # drop a shared instance made under another setting
    try:
        backend = get_backend("faulty")
        assert isinstance(backend, FaultyBackend) and backend.bug == "raster_stride"
        assert {r.case.op for r in check_bundle(bundle, backend).failures} == {"raster"}
    finally:
        unregister_backend("faulty")
