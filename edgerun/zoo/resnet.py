"""ResNet-18 and ResNet-50 (He et al. 2016), 224x224, as in torchvision but without it."""

from __future__ import annotations

import torch
from torch import nn

from edgerun.zoo.cnn_blocks import conv_bn

# The last BatchNorm of each residual branch starts at this scale, as trained ResNets' end up small
# (the zero-init-residual observation, Goyal et al. 2017). At full scale every random branch adds as much
# variance as the identity path, and by the last stage the sum has the heavy tails that cost a per-tensor
# 8-bit activation about 10 dB per bottleneck (docs/quantization.md).
RESIDUAL_BRANCH_GAMMA = 0.25


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(conv_bn(cin, width, 3, stride), conv_bn(width, width, 3, act=None))
        self.shortcut = conv_bn(cin, width, 1, stride, act=None) if stride != 1 or cin != width else nn.Identity()
        self.relu = nn.ReLU(inplace=True)
        nn.init.constant_(self.body[-1][1].weight, RESIDUAL_BRANCH_GAMMA)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(conv_bn(cin, width, 1), conv_bn(width, width, 3, stride),
                                  conv_bn(width, cout, 1, act=None))
        self.shortcut = conv_bn(cin, cout, 1, stride, act=None) if stride != 1 or cin != cout else nn.Identity()
        self.relu = nn.ReLU(inplace=True)
        nn.init.constant_(self.body[-1][1].weight, RESIDUAL_BRANCH_GAMMA)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, block: type[BasicBlock] | type[Bottleneck], depths: list[int], classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1))
        stages: list[nn.Module] = []
        cin = 64
        for i, (width, depth) in enumerate(zip((64, 128, 256, 512), depths)):
            blocks = []
            for j in range(depth):
                blocks.append(block(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = width * block.expansion
            stages.append(nn.Sequential(*blocks))
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet18() -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2])


def resnet50() -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3])
