"""torch.cond, torch.while_loop, scan and torch.map exported to cond, while_loop and scan: a program that
matches torch eager on inputs that take each branch and run different trip counts, saved, loaded and run on
the reference backend and on ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch._higher_order_ops import while_loop
from torch._higher_order_ops.map import map as torch_map
from torch._higher_order_ops.scan import scan

import edgerun
from edgerun.frontends.torch import export
from edgerun.program import Program

BACKENDS = [["reference"], ["onnxruntime", "reference"]]


class Gate(nn.Module):
    """A branch per sign of the input's sum: a linear layer + GELU one way, a cheap rescale the other."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 4)
        self.scale = nn.Parameter(torch.tensor([1.0, -2.0, 0.5, 3.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def busy(x: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.gelu(self.lin(x))

        def cheap(x: torch.Tensor) -> torch.Tensor:
            return x * self.scale - 1

        return torch.cond(x.sum() > 0, busy, cheap, (x,)) + x


class Doubling(nn.Module):
    """Doubles x until its norm passes a limit (a run-time trip count), counting the trips."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.tensor([0.25, 0.0, -0.25]))

    def forward(self, x: torch.Tensor, limit: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def cond_fn(i: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            return (y * y).sum() < limit * limit

        def body_fn(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return i + 1, y * 2 + self.bias

        return while_loop(cond_fn, body_fn, (torch.zeros((), dtype=torch.int64), x))


def _run(program: Program, backends: list[str], args: list[np.ndarray]) -> list[np.ndarray]:
    out = edgerun.load(program, backends=backends)(*args)
    return list(out) if isinstance(out, (list, tuple)) else [out]


@pytest.mark.parametrize("backends", BACKENDS, ids=["reference", "onnxruntime"])
def test_torch_cond_matches_eager_on_both_branches(backends, tmp_path):
    model = Gate().eval()
    program = export(model, (torch.ones(2, 4),))
    assert "cond" in program.graph.op_counts()
    path = tmp_path / "gate.edgerun"
    program.save(path)
    loaded = Program.read(path)
    for sign in (1.0, -1.0):
        x = torch.randn(2, 4).abs() * sign
        want = model(x).detach().numpy()
        (got,) = _run(loaded, backends, [x.numpy()])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backends", BACKENDS, ids=["reference", "onnxruntime"])
def test_torch_while_loop_matches_eager_over_different_trip_counts(backends):
    model = Doubling()
    program = export(model, (torch.ones(3), torch.tensor(10.0)))
    assert "while_loop" in program.graph.op_counts()
    x = torch.tensor([0.5, -1.0, 0.25])
    trips = set()
    for limit in (0.1, 3.0, 100.0, 1e4):
        want_i, want_y = model(x, torch.tensor(limit))
        got_i, got_y = _run(program, backends, [x.numpy(), np.array(limit, np.float32)])
        assert int(got_i) == int(want_i)
        np.testing.assert_allclose(got_y, want_y.detach().numpy(), rtol=1e-6)
        trips.add(int(want_i))
    assert len(trips) == 4  # four different trip counts, zero included
    assert min(trips) == 0


class RunningSum(nn.Module):
    def forward(self, h: torch.Tensor, xs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def step(c: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            c = torch.tanh(c + x)
            return c, c * 2

        return scan(step, h, xs)


class Mapped(nn.Module):
    def forward(self, xs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch_map(lambda x, y: torch.sin(x) + y, xs, y)


@pytest.mark.parametrize("backends", BACKENDS, ids=["reference", "onnxruntime"])
def test_torch_scan_and_map_match_eager(backends):
    h, xs, y = torch.randn(3), torch.randn(5, 3), torch.randn(3)
    program = export(RunningSum(), (h, xs))
    assert "scan" in program.graph.op_counts()
    for got, want in zip(_run(program, backends, [h.numpy(), xs.numpy()]), RunningSum()(h, xs)):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
    program = export(Mapped(), (xs, y))
    (got,) = _run(program, backends, [xs.numpy(), y.numpy()])
    np.testing.assert_allclose(got, Mapped()(xs, y).numpy(), rtol=1e-5, atol=1e-6)


def test_control_flow_in_a_template_specialises_with_its_bodies(tmp_path):
    """torch.cond under a dynamic batch and scan over a dynamic length: one program, several shapes."""
    model = Gate().eval()
    program = export(model, (torch.ones(2, 4),), dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=16)},))
    assert program.graph.symbols == {"batch": (1, 16)}
    path = tmp_path / "gate.edgerun"
    program.save(path)
    loaded = edgerun.load(str(path), backends=["onnxruntime", "reference"])
    for batch in (1, 3, 7):
        for sign in (1.0, -1.0):
            x = torch.randn(batch, 4).abs() * sign
            np.testing.assert_allclose(loaded(x.numpy()), model(x).detach().numpy(), rtol=1e-5, atol=1e-6)
    steps = torch.export.Dim("steps", min=2, max=64)
    program = export(RunningSum(), (torch.randn(3), torch.randn(5, 3)), dynamic_shapes=(None, {0: steps}))
    (node,) = [n for n in program.graph.nodes if n.op == "scan"]
    assert str(node.attrs["length"]) == "steps"
    loaded = edgerun.load(program, backends=["onnxruntime", "reference"])
    for length in (2, 9, 33):
        h, xs = torch.randn(3), torch.randn(length, 3)
        for got, want in zip(loaded(h.numpy(), xs.numpy()), RunningSum()(h, xs)):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-6)
