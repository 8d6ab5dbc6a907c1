"""State and control flow: a buffer read inside a torch.cond branch, written in place inside one, or given a
new value computed in a branch or carried through a torch.while_loop and assigned outside, keeps state like
eager across calls that take each branch (and a while_loop body's in-place writes too); other writes in a
body are refused at export naming body, tensor and fix."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

import edgerun
from edgerun.errors import EdgerunError, VerificationError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import add_subgraph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.ir.verifier import verify


class ReadInBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x.sum(0))
        return torch.cond(x.sum() > 0, lambda x, t: x + t, lambda x, t: x - 2 * t, (x, self.total))


class NewValueFromBranch(nn.Module):
    """The branch taken decides the state's new value: counted up on positive calls, halved on others."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("level", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, new = torch.cond(x.sum() > 0, lambda x, t: (x * t, t + 1), lambda x, t: (x - t, t * 0.5),
                            (x, self.level))
        self.level.copy_(new)
        return y


class CarriedThroughLoop(nn.Module):
    """A while_loop doubling x until its norm passes a bound, accumulating every step into the state."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def body(y: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return y * 2, acc + y

        y, acc = torch.while_loop(lambda y, acc: y.abs().sum() < 20.0, body, (x, self.acc))
        self.acc.copy_(acc)
        return y + acc


@pytest.mark.parametrize("cls", [ReadInBranch, NewValueFromBranch, CarriedThroughLoop])
def test_state_flows_through_control_flow_like_eager(cls, tmp_path) -> None:
    torch.manual_seed(0)
    module = cls()
    program = edgerun.export(module, (torch.rand(3, 4) if cls is not CarriedThroughLoop else torch.rand(4),))
    assert program.state, "the buffer is program state"
    assert any(n.op in ("cond", "while_loop") for n in program.graph.nodes)
    program.save(tmp_path / "m.edgerun")
    model = edgerun.load(tmp_path / "m.edgerun")
    eager = copy.deepcopy(module)
    (name,) = program.state
    for sign in (1.0, -1.0, 1.0, 1.0, -1.0):  # each branch, and the state each leaves for the next call
        x = torch.rand(3, 4) * sign if cls is not CarriedThroughLoop else torch.rand(4) * sign + 0.1 * sign
        np.testing.assert_allclose(model(x.numpy()), eager(x).detach().numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(model.state[name], getattr(eager, name).numpy(), rtol=1e-5, atol=1e-5)
    model.reset_state()
    np.testing.assert_array_equal(model.state[name], program.state[name])


class WriteInBranch(nn.Module):
    """Branches that write the buffer in place: a chain of writes, a read after them, and a plain copy_."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def grow(x: torch.Tensor) -> torch.Tensor:
            self.total.mul_(0.5).add_(x.sum(0))
            return x + self.total

        def reset(x: torch.Tensor) -> torch.Tensor:
            self.total.copy_(x[0])
            return x * 2

        return torch.cond(x.sum() > 0, grow, reset, (x,))


def test_a_buffer_a_cond_branch_writes_in_place_becomes_state_like_eager(tmp_path) -> None:
    """The branch's writes are made functional before torch decomposes the cond (body_state.py): the new value
    leaves the branch as a result and is copied back outside. (Eager torch.cond allows them under no_grad.)"""
    module = WriteInBranch()
    program = edgerun.export(module, (torch.rand(3, 4),))
    assert list(program.state) == ["total"]
    program.save(tmp_path / "w.edgerun")
    model = edgerun.load(tmp_path / "w.edgerun")
    eager = copy.deepcopy(module)
    torch.manual_seed(1)
    for sign in (1.0, 1.0, -1.0, 1.0, -1.0, 1.0):
        x = torch.rand(3, 4) * sign
        with torch.no_grad():
            want = eager(x).numpy()
        np.testing.assert_allclose(model(x.numpy()), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(model.state["total"], eager.total.numpy(), rtol=1e-5, atol=1e-6)


class WriteInput(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def bump(x: torch.Tensor) -> torch.Tensor:
            x.add_(1.0)
            return x + 1

        return torch.cond(x.sum() > 0, bump, lambda x: x - 1, (x,))


class WriteInLoop(nn.Module):
    """A while_loop body that writes a buffer in place (a chain, then reads it) and reads another one."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("acc", torch.zeros(4))
        self.register_buffer("w", torch.linspace(0.5, 2.0, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def body(i: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            self.acc.mul_(0.5).add_(y * self.w)
            return i + 1, y * 2 + self.acc

        return torch.while_loop(lambda i, y: i < 3, body, (torch.tensor(0), x))[1]


def test_a_buffer_a_while_loop_body_writes_in_place_is_carried_like_eager(tmp_path) -> None:
    """The buffer becomes a carried value of the loop, its final value copied back (body_state.py)."""
    module = WriteInLoop()
    program = edgerun.export(module, (torch.rand(4),))
    assert list(program.state) == ["acc"] and any(n.op == "while_loop" for n in program.graph.nodes)
    model = edgerun.load(program)
    eager = copy.deepcopy(module)
    torch.manual_seed(2)
    for _ in range(4):
        x = torch.randn(4)
        with torch.no_grad():
            want = eager(x).numpy()
        np.testing.assert_allclose(model(x.numpy()), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(model.state["acc"], eager.acc.numpy(), rtol=1e-5, atol=1e-5)
    model.reset_state()
    assert not model.state["acc"].any()


class WriteView(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def bump(x: torch.Tensor) -> torch.Tensor:
            self.total[:2].add_(1.0)
            return x + 1

        return torch.cond(x.sum() > 0, bump, lambda x: x - 1, (x,))


@pytest.mark.parametrize("cls, what", [(WriteInput, "its input 'x'"), (WriteView, "'.*', a view computed in the body")])
def test_other_writes_in_a_body_are_refused_naming_body_and_tensor(cls, what) -> None:
    with pytest.raises(EdgerunError, match=rf"torch\.cond body 'true_graph_0' writes {what} in place .*How to fix: "
                                           r"return the new value from the body and assign it outside"):
        edgerun.export(cls(), (torch.rand(4),))


def test_ir_bodies_with_state_fields_fail_verification_clearly() -> None:
    """Bodies are closed graphs bound positionally; state belongs to the method graph, which passes it in."""
    f32 = TensorSpec((4,), DType.float32)
    body = Graph()
    b = Builder(body)
    x = body.add_input("x", f32)
    body.specs["h"] = f32
    body.state_inputs = ["h"]
    body.outputs = [b.emit("add", [x, "h"])]
    body.state_updates = {"h": body.outputs[0]}
    outer = Graph()
    pred = outer.add_input("p", TensorSpec((), DType.bool))
    xo = outer.add_input("x", f32)
    name = add_subgraph(outer, body, "then")
    outer.outputs = Builder(outer).emit_multi("cond", [pred, xo], then=name, **{"else": name})
    with pytest.raises(VerificationError, match=rf"subgraph '{name}' reads or updates state \['h'\]"):
        verify(outer)
