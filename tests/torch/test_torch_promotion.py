"""torch's type promotion becomes explicit casts; the numbers and dtypes match eager PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from edgerun.frontends.torch import export_graph
from edgerun.oracle import interpret


class Fn(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(*xs)


INT = torch.tensor([[1, -2, 3], [4, 5, -6]], dtype=torch.int64)
INT32 = torch.tensor([[7, 8, -9], [1, 2, 3]], dtype=torch.int32)
FLOAT = torch.tensor([[0.5, -1.25, 2.0], [3.5, -0.75, 1.0]])
BOOL = torch.tensor([[True, False, True], [False, True, True]])

CASES = {
    "int_plus_float_scalar": (lambda a: a + 2.5, (INT,)),
    "int_times_int_scalar": (lambda a: a * 3, (INT,)),
    "int32_plus_int64": (lambda a, b: a + b, (INT32, INT)),
    "float_plus_int_tensor": (lambda a, b: a + b, (FLOAT, INT)),
    "bool_plus_float": (lambda a, b: a + b, (BOOL, FLOAT)),
    "int_true_division": (lambda a, b: a / b, (INT, INT32)),
    "int_floor_division": (lambda a, b: torch.div(a, b, rounding_mode="floor"), (INT, INT32)),
    "float_compared_to_int": (lambda a, b: a > b, (FLOAT, INT)),
    "int_compared_to_float_scalar": (lambda a: a >= 2.5, (INT,)),
    "where_mixed_dtypes": (lambda c, a, b: torch.where(c, a, b), (BOOL, INT, FLOAT)),
    "where_scalar_other": (lambda c, a: torch.where(c, a, 0.5), (BOOL, INT32)),
    "exp_of_int": (lambda a: torch.exp(a.float() * 0.1) + torch.sigmoid(a), (INT,)),
    "sum_of_bool": (lambda a: a.sum(dim=1), (BOOL,)),
    "mean_after_cast": (lambda a: a.to(torch.float32).mean(), (INT32,)),
    "cat_mixed": (lambda a, b: torch.cat([a, b], dim=0), (INT32, FLOAT)),
    "masked_fill_int": (lambda a, m: a.masked_fill(m, -1), (INT, BOOL)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_promotion_matches_eager(case: str) -> None:
    fn, args = CASES[case]
    module = Fn(fn)
    graph = export_graph(module, args)
    (got,) = interpret(graph, [a.numpy() for a in args])
    want = fn(*args).numpy()
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)


def test_mixed_dtypes_become_explicit_casts() -> None:
    graph = export_graph(Fn(lambda a, b: a + b), (INT32, FLOAT))
    assert graph.op_counts().get("cast") == 1
    cast = next(n for n in graph.nodes if n.op == "cast")
    assert cast.attrs["dtype"] == "float32"


def test_scalars_become_zero_d_constants_of_the_compute_dtype() -> None:
    graph = export_graph(Fn(lambda a: a * 3), (INT32,))
    mul = next(n for n in graph.nodes if n.op == "mul")
    scalar = graph.constants[mul.inputs[1]]
    assert scalar.shape == () and scalar.dtype == np.int32 and int(scalar) == 3
