"""Building blocks shared by the CNN families."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1, act: Any = nn.ReLU) -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


def image_classifier_batches(size: int = 224, count: int = 2, batch: int = 2) -> list[torch.Tensor]:
    from edgerun.zoo.inputs import natural_image

    return [natural_image(size, seed=100 + i, batch=batch) for i in range(count)]
