"""Give BatchNorm layers realistic running statistics, so exported models fold and run real BN numerics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def calibrate_batchnorm(model: Any, batches: list[Any]) -> Any:
    """Run `batches` through `model` in train mode with cumulative BN averages, then return it in eval mode."""
    import torch

    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in bns]
    for m in bns:
        m.reset_running_stats()
        m.momentum = None  # cumulative moving average: the stats are the true means over the batches
    model.train()
    with torch.no_grad():
        for x in batches:
            model(x)
    for m, momentum in zip(bns, saved):
        m.momentum = momentum
    return model.eval()


def build_seeded(factory: Callable[[], Any], seed: int) -> Any:
    """Call `factory` with torch's global RNG seeded, leaving the caller's RNG state untouched."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return factory()
