"""Errors the PyTorch frontend raises must name what failed and where (op, module path, user source line)."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.torch import ExportFailedError, export_graph


class Attention(nn.Module):
    def __init__(self, unsupported: bool) -> None:
        super().__init__()
        self.unsupported = unsupported
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.proj(x)
        if self.unsupported:
            x = torch.cumprod(x, dim=-1)  # UNSUPPORTED-LINE
        return x


class Layer(nn.Module):
    def __init__(self, unsupported: bool) -> None:
        super().__init__()
        self.attention = Attention(unsupported)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.attention(x)


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.ModuleList([Layer(unsupported=(i == 3)) for i in range(5)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x)
        return x


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.encoder(x)


def _line_of(marker: str) -> int:
    lines, start = inspect.getsourcelines(Attention)
    return start + next(i for i, line in enumerate(lines) if marker in line)


def test_unsupported_op_names_aten_op_module_path_and_source_line() -> None:
    with pytest.raises(UnsupportedOpError) as info:
        export_graph(Model(), (torch.randn(2, 8),))
    err = info.value
    assert err.op == "aten.cumprod.default"
    assert err.module_path == "encoder.layer.3.attention"
    assert err.source == f"{__file__}:{_line_of('UNSUPPORTED-LINE')}"
    message = str(err)
    assert "aten.cumprod.default" in message and "encoder.layer.3.attention" in message
    assert f"test_torch_frontend_errors.py:{_line_of('UNSUPPORTED-LINE')}" in message


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x - 1


def test_torch_export_failure_is_an_edgerun_error_with_a_fix() -> None:
    with pytest.raises(ExportFailedError) as info:
        export_graph(DataDependent(), (torch.randn(3),))
    assert isinstance(info.value, EdgerunError)
    message = str(info.value)
    assert "torch.export failed" in message
    assert "data-dependent" in message and "torch.where" in message


def test_unbounded_dynamic_shapes_are_refused_clearly() -> None:
    batch = torch.export.Dim("batch")
    with pytest.raises(EdgerunError, match=r"Dim\('batch'\) has no max; edgerun plans memory"):
        export_graph(nn.Linear(4, 4), (torch.randn(2, 4),), dynamic_shapes={"input": {0: batch}})
    with pytest.raises(EdgerunError, match="named, bounded dimensions"):
        export_graph(nn.Linear(4, 4), (torch.randn(2, 4),), dynamic_shapes={"input": {0: torch.export.Dim.AUTO}})


class ReturnsInt(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return x + 1, 3


def test_non_tensor_outputs_are_rejected() -> None:
    with pytest.raises(EdgerunError, match="not a tensor"):
        export_graph(ReturnsInt(), (torch.randn(3),))


class Transposed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.ConvTranspose2d(3, 4, 2, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.up(x)


def test_unsupported_attribute_combination_is_explicit() -> None:
    with pytest.raises(UnsupportedOpError, match="transposed convolution") as info:
        export_graph(Transposed(), (torch.randn(1, 3, 4, 4),))
    assert info.value.module_path == "up"


class Cond(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cond(x.sum() > 0, lambda x: x * 2, lambda x: x - 1, (x,))


class WhileLoop(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch._higher_order_ops import while_loop
        return while_loop(lambda i, x: i < 3, lambda i, x: (i + 1, x * 2), (torch.tensor(0), x))[1]


@pytest.mark.parametrize(("model", "op"), [(Cond(), "cond"), (WhileLoop(), "while_loop")], ids=["cond", "while"])
def test_higher_order_control_flow_refused_with_what_works_today(model: nn.Module, op: str) -> None:
    with pytest.raises(UnsupportedOpError) as info:
        export_graph(model, (torch.ones(3),))
    message = str(info.value)
    assert "cannot be converted yet" in message and "torch.where" in message
    assert f"unsupported operator '{op}'" in message  # not a deep AttributeError from a branch subgraph


def test_no_message_recommends_what_cannot_be_converted() -> None:
    """Every hint that names torch.cond says it cannot be converted (it used to recommend it)."""
    from edgerun.frontends.torch.capture import _explain

    class GuardOnDataDependentSymNode(Exception):
        pass

    for text in (_explain(GuardOnDataDependentSymNode("Could not guard on data-dependent expression")),
                 _explain(RuntimeError("unsupported Python"))):
        assert "torch.cond" in text and "cannot convert" in text.replace("cannot be converted", "cannot convert")
