"""torch.float64 and the 16/32/64-bit integer types torch has export to edgerun and match eager PyTorch, on the
reference kernels and on ONNX Runtime's delegate; a float64 model is a float64 program (weights included)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from edgerun.frontends.torch import export
from edgerun.program import Program
from edgerun.runtime import load


class DoubleMlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(6, 8).double()
        self.fc2 = nn.Linear(8, 3).double()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc2(torch.tanh(self.fc1(x))) * 0.5 + 1e-12, dim=-1)


class IntMix(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * 3 + b).sum(dim=1) - torch.maximum(a, b).amax(dim=1)


class UnsignedLayout(nn.Module):
    """What eager torch can run on its uint16/32/64 (it has no arithmetic kernels for them): layout,
    equality and casts."""

    def forward(self, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = torch.cat([a, a.flip(0)], 0).t()[1:]
        return y, a == a.flip(0), y.to(torch.int64)


def test_float64_module_matches_eager_in_double_precision(tmp_path) -> None:
    module = DoubleMlp().eval()
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    program = export(module, (x,))
    weights = [a for a in program.graph.constants.values() if a.ndim == 2]
    assert weights and all(a.dtype == np.float64 for a in weights)
    with torch.no_grad():
        want = module(x).numpy()
    path = tmp_path / "double.edgr"
    program.save(path)
    for backends in (["reference"], ["onnxruntime"]):
        got = load(Program.read(path), backends=backends)(x.numpy())
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-15)  # float32 would be off by ~1e-7


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32], ids=str)
def test_signed_integer_arithmetic_matches_eager(dtype: torch.dtype) -> None:
    a = torch.tensor([[1, 7, -3], [20, 5, 9]], dtype=dtype)
    b = torch.tensor([[4, -2, 8], [1, 30, 6]], dtype=dtype)
    with torch.no_grad():
        want = IntMix()(a, b)
    program = export(IntMix(), (a, b))
    assert program.graph.specs[program.graph.inputs[0]].dtype.value == str(dtype).removeprefix("torch.")
    got = load(program, backends=["reference"])(a.numpy(), b.numpy())
    assert str(got.dtype) == str(want.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(got, want.numpy())


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64], ids=str)
def test_unsigned_layout_and_casts_match_eager(dtype: torch.dtype) -> None:
    np_dtype = np.dtype(str(dtype).removeprefix("torch."))
    top = int(np.iinfo(np_dtype).max)  # above the signed type's range: a signed reading would show
    a = torch.from_numpy(np.array([[1, top, 3], [1, 5, top // 2 + 1]], np_dtype))
    with torch.no_grad():
        want = UnsignedLayout()(a)
    program = export(UnsignedLayout(), (a,))
    got = load(program, backends=["onnxruntime"])(a.numpy())
    for g, w in zip(got, want, strict=True):
        assert str(g.dtype) == str(w.dtype).removeprefix("torch.")
        np.testing.assert_array_equal(g, w.numpy())


class DoubleOps(nn.Module):
    """Ops whose lowering builds constants or composites: each must stay float64 throughout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = torch.nn.functional
        return (f.interpolate(x, scale_factor=1.7, mode="bilinear") + f.gelu(x).sum()
                + f.gelu(x, approximate="tanh").mean() + f.layer_norm(x, (5,)).sum() + f.avg_pool2d(x, 2).mean()
                + f.silu(x).mean() + torch.rsqrt(x.abs() + 1).mean() + torch.softmax(x, -1).pow(2).mean())


def test_float64_lowerings_keep_double_precision() -> None:
    x = torch.randn(1, 2, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    got = load(export(DoubleOps(), (x,)), backends=["reference"])(x.numpy())
    with torch.no_grad():
        want = DoubleOps()(x).numpy()
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)  # float32 weights would be off by ~1e-7
