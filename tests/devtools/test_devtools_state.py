"""carve, check, inspect and migrate on a program with state and two methods: one method at a time
(--method), its state fed through a sequence of calls (each --inputs one call, from the state the
reference left after the one before), so a bug that only the third call's state reaches is found there."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import edgerun
from edgerun.cli import main
from edgerun.devtools.bundle import TestBundle
from edgerun.devtools.programs import call_sequence, load_graph
from edgerun.errors import EdgerunError


class Accumulate(nn.Module):
    """forward adds its input into `acc` and squashes 10*acc: with inputs of 2, tanh sees 20, 40, 60, so a
    tanh that overflows above 44 (faulty:tanh_nan) first goes wrong in the third call. `peek` reads acc."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("acc", torch.zeros(1, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.acc.add_(x)
        return torch.tanh(self.acc * 10) + self.proj(x)

    def peek(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) * self.acc


@pytest.fixture(scope="module")
def stateful(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, Path, list[str]]:
    torch.manual_seed(0)
    module = Accumulate()
    program = edgerun.export_methods(module, {"forward": ("forward", (torch.full((1, 4), 2.0),)),
                                              "peek": ("peek", (torch.randn(1, 4),))})
    assert sorted(program.state) == ["acc"]
    root = tmp_path_factory.mktemp("stateful")
    path = root / "acc.edgerun"
    program.save(path)
    calls = []
    for k in range(3):
        calls.append(str(root / f"call{k}.npz"))
        np.savez(calls[-1], x=np.full((1, 4), 2.0, np.float32) + np.float32(0.01 * k))
    return module, path, calls


def test_each_call_starts_from_the_state_the_one_before_left(stateful) -> None:
    module, path, calls = stateful
    loaded = load_graph(path)
    assert loaded.state is not None and loaded.user_inputs == ["x"] and loaded.graph.inputs == ["x", "acc"]
    xs = [dict(np.load(c)) for c in calls]
    sets = call_sequence(loaded, xs)
    eager = copy.deepcopy(module)
    for inputs, x in zip(sets, xs):
        np.testing.assert_allclose(inputs["acc"], eager.acc.numpy(), rtol=1e-6)
        eager(torch.from_numpy(x["x"]))
    # A call may set the state itself; the other method reads the same state.
    peek = load_graph(path, "peek")
    (inputs,) = call_sequence(peek, [{"x": xs[0]["x"], "acc": np.full((1, 4), 3.0, np.float32)}])
    assert peek.method == "peek" and (inputs["acc"] == 3.0).all()
    with pytest.raises(EdgerunError, match=r"names \['y'\], which are neither inputs of the program"):
        call_sequence(loaded, [{"x": xs[0]["x"], "y": xs[0]["x"]}])
    with pytest.raises(EdgerunError, match=r"no method 'decode'; its methods are \['forward', 'peek'\]"):
        load_graph(path, "decode")


def test_carve_and_check_find_the_case_only_the_third_call_reaches(stateful, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _, path, calls = stateful
    bundle_dir = str(tmp_path / "b")
    assert main(["carve", str(path), *[a for c in calls for a in ("--inputs", c)], "-o", bundle_dir]) == 0
    bundle = TestBundle.read(bundle_dir)
    tanh_cases = [c for c in bundle.select([], [], []) if c.op == "tanh"]
    assert len(tanh_cases) == 3  # one per call: the state reached each
    assert main(["check", bundle_dir, "--backend", "onnxruntime"]) == 0
    assert main(["check", bundle_dir, "--backend", "faulty:tanh_nan", "--json", str(tmp_path / "c.json")]) == 1
    report = json.loads((tmp_path / "c.json").read_text())
    assert report["failed"] == 1 and report["failures"][0]["op"] == "tanh"
    capsys.readouterr()


def test_inspect_walks_the_calls_to_the_first_that_diverges(stateful, capsys: pytest.CaptureFixture[str]) -> None:
    _, path, calls = stateful
    args = ["inspect", str(path), "--backend", "faulty:tanh_nan", *[a for c in calls for a in ("--inputs", c)]]
    assert main(args) == 1
    text = capsys.readouterr().out
    assert "call 1 of 3" in text and "call 3 of 3" in text
    before, third = text.split("call 3 of 3")
    assert "divergence starts" not in before and "divergence starts at node" in third and "tanh" in third
    assert main(["inspect", str(path), "--backend", "onnxruntime", *args[4:]]) == 0


def test_migrate_one_method_with_its_state_given(stateful, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    _, path, calls = stateful
    peek_call = str(tmp_path / "peek.npz")
    np.savez(peek_call, x=np.ones((1, 4), np.float32), acc=np.full((1, 4), 5.0, np.float32))
    report_dir = tmp_path / "peek-report"
    assert main(["migrate", str(path), "--method", "peek", "--inputs", peek_call, "--to", "onnxruntime",
                 "--report-dir", str(report_dir)]) == 0
    assert TestBundle.read(str(report_dir / "tests.bundle")).meta["method"] == "peek"
    # forward, three calls, onto the faulty tanh: the move stops at tanh, on the third call's case.
    report_dir = tmp_path / "forward-report"
    assert main(["migrate", str(path), "--method", "forward", *[a for c in calls for a in ("--inputs", c)],
                 "--to", "faulty:tanh_nan", "--report-dir", str(report_dir)]) == 1
    steps = json.loads((report_dir / "migration.json").read_text())["steps"]
    assert steps[-1]["unit"] == "tanh" and not steps[-1]["op_passed"]
    assert all(s["op_passed"] and s["model_passed"] for s in steps[:-1])
    capsys.readouterr()
    # a bundle carved from one method is refused for another
    assert main(["migrate", str(path), "--method", "peek", "--inputs", peek_call, "--to", "onnxruntime",
                 "--bundle", str(report_dir / "tests.bundle"), "--report-dir", str(tmp_path / "x")]) == 1
    assert "carved from method 'forward', not 'peek'" in capsys.readouterr().err
