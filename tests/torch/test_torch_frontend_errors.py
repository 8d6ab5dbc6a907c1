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


class DropoutAttention(nn.Module):
    def forward(self, q: torch.Tensor) -> torch.Tensor:
        return nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.5)


class WithDropoutAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = DropoutAttention()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)


def test_unsupported_attribute_combination_is_explicit() -> None:
    with pytest.raises(UnsupportedOpError, match="attention dropout") as info:
        export_graph(WithDropoutAttention(), (torch.randn(1, 2, 4, 8),))
    assert info.value.module_path == "attn"


def test_the_data_dependent_hint_recommends_the_control_flow_edgerun_converts() -> None:
    from edgerun.frontends.torch.capture import _explain

    class GuardOnDataDependentSymNode(Exception):
        pass

    text = _explain(GuardOnDataDependentSymNode("Could not guard on data-dependent expression"))
    assert "torch.cond(pred, true_fn, false_fn, operands)" in text and "torch.while_loop" in text
    assert "cannot" not in text.split("How to fix:")[1].replace("cannot capture", "")
