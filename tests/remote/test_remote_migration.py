"""TAPML's workflow across the wire: the faulty backend runs in another process behind `edgerun serve`; the
host runs the reference, carves, migrates op by op to the remote device, and migrate names the faulty op."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from remote_testkit import start_server

from edgerun.backends.registry import get_backend
from edgerun.backends.remote import RemoteBackend
from edgerun.cli import main
from edgerun.devtools.carve import carve
from edgerun.devtools.check import check_bundle
from edgerun.devtools.fault_proof import FAULTY_OP, proof_loaded, proof_model, realistic_inputs
from edgerun.devtools.migrate import migrate
from edgerun.devtools.programs import save_inputs
from edgerun.program import Program


@pytest.mark.parametrize("bug", ["tanh_nan", "raster_stride"])
def test_migrate_names_the_faulty_op_on_a_remote_device(tmp_path: Path, bug: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    srv = start_server(tmp_path, "--backends", "faulty", env={"EDGERUN_FAULT": bug})
    monkeypatch.setenv("EDGERUN_TOKEN", srv.token)  # hybrid runs resolve the backend by its name
    try:
        remote = RemoteBackend(srv.url, srv.token)
        loaded = proof_loaded()
        inputs = realistic_inputs()
        carved = carve(loaded, inputs)
        op = FAULTY_OP[bug]
        # The carved cases of the faulty op fail on the device and pass on the host's reference.
        assert not check_bundle(carved, remote, ops=[op]).passed
        assert check_bundle(carved, get_backend("reference"), ops=[op]).passed
        report = migrate(loaded, inputs, carved, get_backend("reference"), remote)
        assert report.failed is not None and report.failed.unit == op
        assert all(s.passed for s in report.steps[:-1])
        remote.device.close()
    finally:
        srv.stop()


def test_cli_migrate_to_a_remote_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    srv = start_server(tmp_path, "--backends", "faulty", env={"EDGERUN_FAULT": "exp_range"})
    try:
        program = tmp_path / "proof.erp"
        Program(graph=proof_model()).save(program)
        npz = []
        for k, feeds in enumerate(realistic_inputs()):
            save_inputs(tmp_path / f"real{k}.npz", feeds)
            npz += ["--inputs", str(tmp_path / f"real{k}.npz")]
        monkeypatch.setenv("EDGERUN_TOKEN", srv.token)
        rep = tmp_path / "rep"
        rc = main(["migrate", str(program), "--from", "reference", "--to", f"remote:{srv.address}", *npz,
                   "--report-dir", str(rep)])
        assert rc == 1
        data = json.loads((rep / "migration.json").read_text())
        assert data["failed"] == "exp"
        assert data["target"].startswith("remote:")
        # Placement across the wire: the whole program on the device, outputs back on the host.
        import edgerun

        feeds = realistic_inputs()[0]
        on_device = edgerun.load(program, backends=[f"remote:{srv.address}"])
        assert {p.backend for p in on_device.partitions} == {f"remote:{srv.address}"}
        local = edgerun.load(program)
        got, want = on_device.run(feeds), local.run(feeds)
        assert len(got) == len(want)
        assert any(not np.array_equal(g, w, equal_nan=True) for g, w in zip(got, want))  # the bug shows
    finally:
        srv.stop()


def test_inspect_and_profile_across_the_wire(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    srv = start_server(tmp_path, "--backends", "faulty", env={"EDGERUN_FAULT": "tanh_nan"})
    try:
        program = tmp_path / "proof.erp"
        Program(graph=proof_model()).save(program)
        save_inputs(tmp_path / "real.npz", realistic_inputs()[0])
        monkeypatch.setenv("EDGERUN_TOKEN", srv.token)
        backend = f"remote:{srv.address}"
        report = tmp_path / "inspect.json"
        main(["inspect", str(program), "--backend", backend, "--op", "tanh", "--inputs", str(tmp_path / "real.npz"),
              "--json", str(report)])
        assert "tanh" in capsys.readouterr().out
        assert report.exists() and "tanh" in report.read_text()
        trace = tmp_path / "trace.json"
        rc = main(["profile", str(program), "--backend", "reference", "--backend", backend, "--op", "tanh",
                   "--inputs", str(tmp_path / "real.npz"), "--repeat", "2", "--trace", str(trace)])
        assert rc == 0
        events = json.loads(trace.read_text())
        events = events["traceEvents"] if isinstance(events, dict) else events
        assert any(backend in json.dumps(e) for e in events), "the remote partition shows in the trace"
    finally:
        srv.stop()
