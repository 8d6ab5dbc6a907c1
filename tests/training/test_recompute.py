"""Recompute versus keep (passes/autodiff.py, recompute_cheap): cheap elementwise activations are computed
again in backward instead of kept, the gradients are the same bit for bit, and the planned arena is smaller;
with a memory budget (recompute_to_budget) more is computed again until the kept activations fit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import edgerun.training as T
from edgerun.errors import EdgerunError
from edgerun.passes.autodiff import RECOMPUTED
from edgerun.zoo.digits_cnn import DigitsCNN


def _both(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[T.TrainingProgram, T.TrainingProgram]:
    return tuple(T.from_torch(module, (x,), optimizer=T.SGD(0.01), backends=["reference"], recompute=r)
                 for r in (False, True))  # type: ignore[return-value]


def _check(module: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[dict[str, int], dict[str, int]]:
    kept, again = _both(module, x, y)
    g_kept, g_again = kept.gradients(x.numpy(), y.numpy()), again.gradients(x.numpy(), y.numpy())
    for name in g_kept:
        np.testing.assert_array_equal(g_again[name], g_kept[name])  # the same ops on the same values
    assert kept.train_step(x.numpy(), y.numpy()) == again.train_step(x.numpy(), y.numpy())
    # the copies survive the pipeline (common-subexpression elimination leaves them apart)
    step = again.program.methods["train_step"]
    assert any(RECOMPUTED in n.meta for n in step.nodes)
    assert not any(RECOMPUTED in n.meta for n in kept.program.methods["train_step"].nodes)
    arenas = [{m: p.loaded.method(m).arena_bytes for m in ("train_step", "gradients")} for p in (kept, again)]
    bytes_ = again.program.metadata["training"]["activation_bytes"]
    assert bytes_["kept_for_backward"] < bytes_["kept_without_recompute"]
    assert kept.program.metadata["training"]["activation_bytes"]["kept_for_backward"] == \
        bytes_["kept_without_recompute"]
    return arenas[0], arenas[1]


def test_a_cnn_recomputes_its_relus_and_plans_a_smaller_arena() -> None:
    torch.manual_seed(0)
    kept, again = _check(DigitsCNN(8, 16, 32).eval(), torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,)))
    assert again["train_step"] < kept["train_step"] and again["gradients"] < kept["gradients"]


def test_a_gelu_block_recomputes_the_gelu_intermediates() -> None:
    torch.manual_seed(0)
    # Two blocks: while the second's backward runs (the peak), the first's GELU intermediates are no longer held.
    block = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64), torch.nn.GELU(),
                                torch.nn.Linear(64, 10)).eval()
    kept, again = _check(block, torch.randn(256, 16), torch.randint(0, 10, (256,)))  # activations dominate
    assert again["train_step"] < kept["train_step"] and again["gradients"] < kept["gradients"]


def test_a_memory_budget_recomputes_more_until_the_kept_activations_fit() -> None:
    torch.manual_seed(0)
    module, x, y = DigitsCNN(8, 16, 32).eval(), torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))
    cheap = T.from_torch(module, (x,), optimizer=T.SGD(0.01), backends=["reference"])
    kept = cheap.program.metadata["training"]["activation_bytes"]["kept_for_backward"]
    budget = kept // 2
    fitted = T.from_torch(module, (x,), optimizer=T.SGD(0.01), backends=["reference"], activation_budget=budget)
    record = fitted.program.metadata["training"]["activation_bytes"]
    assert record["kept_for_backward"] <= budget and record["budget"] == budget
    # a convolution or matmul output is among what is computed again, not only the cheap elementwise ones
    again = {n.op for n in fitted.program.methods["train_step"].nodes if RECOMPUTED in n.meta}
    assert again & {"conv2d", "matmul", "max_pool2d", "avg_pool2d", "raster"}
    g_cheap, g_fitted = cheap.gradients(x.numpy(), y.numpy()), fitted.gradients(x.numpy(), y.numpy())
    for name in g_cheap:
        np.testing.assert_array_equal(g_fitted[name], g_cheap[name])
    assert cheap.train_step(x.numpy(), y.numpy()) == fitted.train_step(x.numpy(), y.numpy())
    assert fitted.loaded.method("train_step").arena_bytes <= cheap.loaded.method("train_step").arena_bytes
    with pytest.warns(RuntimeWarning, match=r"activation_budget 0 B is below what backward must keep: .* keeps [\d,]+ B"):
        T.from_torch(module, (x,), optimizer=T.SGD(0.01), backends=["reference"], activation_budget=0)
    for bad in (-1, True, 1.5):
        with pytest.raises(EdgerunError, match="activation_budget must be a number of bytes"):
            T.from_torch(module, (x,), optimizer=T.SGD(0.01), backends=["reference"], activation_budget=bad)
    with pytest.raises(EdgerunError, match="with recompute on"):
        T.from_torch(module, (x,), optimizer=T.SGD(0.01), backends=["reference"], recompute=False,
                     activation_budget=1000)
