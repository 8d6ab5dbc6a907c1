"""The user-facing export: a Program whose nodes say where they came from, that saves and loads."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import edgerun
from edgerun.frontends.torch import export, export_graph, supported_aten_ops
from edgerun.ir.registry import OpKind, get_op
from edgerun.ir.verifier import verify
from edgerun.passes.decompose_pass import PROGRAM_COMPOSITES


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.conv(x)))
        return torch.softmax(self.head(y.mean(dim=(2, 3))), dim=-1)


def _block() -> Block:
    torch.manual_seed(0)
    block = Block()
    block.bn.running_mean.uniform_(-0.5, 0.5)
    block.bn.running_var.uniform_(0.5, 2.0)
    return block.eval()


def test_nodes_carry_module_path_source_and_aten_op() -> None:
    graph = export_graph(_block(), (torch.randn(1, 3, 8, 8),))
    conv = next(n for n in graph.nodes if n.op == "conv2d")
    assert conv.meta["module_path"] == "conv"
    assert conv.meta["frontend_op"] == "aten.convolution.default"
    assert conv.meta["source"].startswith(__file__ + ":")
    assert graph.inputs == ["x"]
    assert all(a.dtype == np.float32 for a in graph.constants.values() if a.dtype.kind == "f")


def test_export_saves_and_loads_and_matches_eager(tmp_path) -> None:
    block = _block()
    x = torch.randn(1, 3, 8, 8)
    program = export(block, (x,), name="block")
    verify(program.graph)
    # The default pipeline decomposed everything but the composites a backend may keep whole at load.
    assert {n.op for n in program.graph.nodes if get_op(n.op).kind is OpKind.COMPOSITE} <= PROGRAM_COMPOSITES
    assert program.metadata["name"] == "block"
    assert next(r["name"] for r in program.metadata["passes"]) == "decompose"
    path = tmp_path / "block.edgerun"
    program.save(path)
    loaded = edgerun.load(path)
    got = loaded(x.numpy())
    np.testing.assert_allclose(got, block(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_export_without_optimize_keeps_composites() -> None:
    program = export(_block(), (torch.randn(1, 3, 8, 8),), optimize=False)
    assert "batch_norm" in program.graph.op_counts()


def test_supported_ops_are_the_handler_table() -> None:
    ops = supported_aten_ops()
    assert "aten.convolution.default" in ops and "aten.add.Tensor" in ops
    assert "aten.cumprod.default" not in ops
