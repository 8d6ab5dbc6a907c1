"""The zoo and export commands, run in-process through the real argument parser."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import edgerun
from edgerun import zoo
from edgerun.cli import main


def test_zoo_list_prints_every_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    for name in zoo.list_models():
        assert name in out


def test_zoo_export_writes_a_loadable_program(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "mlp.edgerun"
    assert main(["zoo", "export", "mlp", "-o", str(path)]) == 0
    captured = capsys.readouterr()
    assert "[1/4] building mlp" in captured.err and "wrote" in captured.out
    spec = zoo.get("mlp")
    (x,) = spec.example_inputs()
    got = edgerun.load(path)(x.numpy())
    with torch.no_grad():
        want = spec.build()(x).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)


def test_export_factory_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_model_factory.py").write_text(
        "import torch\n"
        "def make():\n"
        "    torch.manual_seed(0)\n"
        "    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh()), (torch.randn(2, 4),)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    out = tmp_path / "m.edgerun"
    assert main(["export", "my_model_factory:make", "-o", str(out)]) == 0
    loaded = edgerun.load(out)
    assert loaded.input_names == ["input"]
    assert loaded(np.zeros((2, 4), np.float32)).shape == (2, 3)


def test_export_reports_bad_factory_paths(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["export", "no_such_module_xyz:make", "-o", str(tmp_path / "x")]) == 1
    assert "cannot import 'no_such_module_xyz:make'" in capsys.readouterr().err
    assert main(["zoo", "export", "resnet19", "-o", str(tmp_path / "x")]) == 1
