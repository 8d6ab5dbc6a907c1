"""SqueezeNet 1.1 (Iandola et al. 2016), 224x224."""

from __future__ import annotations

import torch
from torch import nn


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, expand1: int, expand3: int) -> None:
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU(inplace=True))
        self.expand1 = nn.Sequential(nn.Conv2d(squeeze, expand1, 1), nn.ReLU(inplace=True))
        self.expand3 = nn.Sequential(nn.Conv2d(squeeze, expand3, 3, padding=1), nn.ReLU(inplace=True))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.squeeze(x)
        return torch.cat([self.expand1(s), self.expand3(s)], 1)


class SqueezeNet11(nn.Module):
    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        pool = nn.MaxPool2d(3, 2, ceil_mode=True)
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2), nn.ReLU(inplace=True), pool,
            Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), pool,
            Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), pool,
            Fire(256, 48, 192, 192), Fire(384, 48, 192, 192), Fire(384, 64, 256, 256), Fire(512, 64, 256, 256))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(512, classes, 1), nn.ReLU(inplace=True),
                                        nn.AdaptiveAvgPool2d(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)
