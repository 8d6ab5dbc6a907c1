"""Data-dependent initialisation of the zoo's CNNs, so their random weights behave numerically like trained ones.

Plain random conv filters are mostly orthogonal to what images contain (smooth, correlated patches): on
them a filter's response is small and BatchNorm, normalising it to unit variance, amplifies whatever else
reaches the channel. Stacked 20 to 50 times this makes the network chaotic: the zoo's MobileNetV2 kept 8.8 dB
of output SQNR when its input got 1 % noise, so no 8-bit scheme could be judged on it. Trained filters
match their inputs' statistics instead. `init_convs_from_data` gives each conv that feeds a BatchNorm
filters drawn from the span of the patches it actually sees (w = a @ P, a Gaussian, P real centred input
patches, as in data-dependent initialisation of CNNs), and `calibrate_batchnorm` then gives every BN
the true statistics of its input, so each BN output is about unit variance on image-like data.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import pairwise
from typing import Any


def convs_feeding_batchnorm(model: Any) -> list[Any]:
    """The Conv2d modules directly followed by a BatchNorm in a Sequential (the conv_bn blocks)."""
    import torch

    found = []
    for seq in model.modules():
        if isinstance(seq, torch.nn.Sequential):
            for conv, bn in pairwise(seq.children()):
                if isinstance(conv, torch.nn.Conv2d) and isinstance(bn, torch.nn.modules.batchnorm._BatchNorm):
                    found.append(conv)
    return found


def init_convs_from_data(model: Any, images: Any, seed: int, max_patches: int = 2048) -> Any:
    """Redraw every conv-before-BN's filters as random combinations of its real (centred) input patches.

    One forward pass in train mode, layer by layer as the data flows (a pre-hook initialises each conv
    from the input it receives, so later layers see the already re-initialised earlier ones, batch-
    normalised with the batch's own statistics). Each filter keeps its random init's norm (the scale is
    BatchNorm's business anyway). Deterministic: a generator seeded with `seed`.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)

    def redraw(conv: Any, args: tuple[Any, ...]) -> None:
        groups = conv.groups
        per_group, fan_in = conv.out_channels // groups, conv.weight[0].numel()
        # twice the fan-in spans the patches' space; more only costs time
        patches = _patches(conv, args[0], min(max_patches, max(256, 2 * fan_in)), gen)  # (M, C*kh*kw)
        picked = patches - patches.mean(dim=0, keepdim=True)
        mix = torch.randn(groups, per_group, picked.shape[0], generator=gen)
        new = torch.bmm(mix, picked.reshape(-1, groups, fan_in).transpose(0, 1))  # (groups, per_group, fan_in)
        new = new.reshape(conv.weight.shape)
        old_norm = conv.weight.flatten(1).norm(dim=1)
        new_norm = new.flatten(1).norm(dim=1).clamp_min(1e-12)
        conv.weight.copy_(new * (old_norm / new_norm)[:, None, None, None])

    done: set[int] = set()

    def pre_hook(conv: Any, args: tuple[Any, ...]) -> None:
        if id(conv) not in done:
            done.add(id(conv))
            redraw(conv, args)

    hooks = [conv.register_forward_pre_hook(pre_hook) for conv in convs_feeding_batchnorm(model)]
    model.train()
    try:
        with torch.no_grad():
            model(images)
    finally:
        for h in hooks:
            h.remove()
    return model


def _patches(conv: Any, x: Any, count: int, gen: Any) -> Any:
    """`count` of the conv's input patches at random positions of the whole batch, as (count, C*kh*kw) rows in
    F.unfold's order (channel, then kernel row, then column), gathered without unfolding everything."""
    import torch
    import torch.nn.functional as F

    ph, pw = conv.padding if isinstance(conv.padding, tuple) else (0, 0)
    x = F.pad(x, (pw, pw, ph, ph))
    (kh, kw), (sh, sw), (dh, dw) = conv.kernel_size, conv.stride, conv.dilation
    out_h, out_w = (x.shape[2] - dh * (kh - 1) - 1) // sh + 1, (x.shape[3] - dw * (kw - 1) - 1) // sw + 1
    n = torch.randint(0, x.shape[0], (count,), generator=gen)
    rows = torch.randint(0, out_h, (count,), generator=gen)[:, None] * sh + torch.arange(kh) * dh  # (count, kh)
    cols = torch.randint(0, out_w, (count,), generator=gen)[:, None] * sw + torch.arange(kw) * dw  # (count, kw)
    picked = x[n[:, None, None], :, rows[:, :, None], cols[:, None, :]]  # (count, kh, kw, C)
    return picked.permute(0, 3, 1, 2).reshape(count, -1)


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
