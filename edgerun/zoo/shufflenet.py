"""ShuffleNetV2 x1.0 (Ma et al. 2018), 224x224: channel split, channel shuffle, depthwise convolutions."""

from __future__ import annotations

import torch
from torch import nn

from edgerun.zoo.cnn_blocks import conv_bn


def channel_shuffle(x: torch.Tensor, groups: int) -> torch.Tensor:
    n, c, h, w = x.shape
    return x.view(n, groups, c // groups, h, w).transpose(1, 2).reshape(n, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        branch = cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(conv_bn(cin, cin, 3, stride, groups=cin, act=None),
                                         conv_bn(cin, branch, 1))
        src = cin if stride > 1 else branch
        self.branch2 = nn.Sequential(conv_bn(src, branch, 1), conv_bn(branch, branch, 3, stride, groups=branch,
                                                                       act=None), conv_bn(branch, branch, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 1:
            keep, work = x.chunk(2, dim=1)
            out = torch.cat((keep, self.branch2(work)), 1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), 1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, repeats: tuple[int, ...] = (4, 8, 4), channels: tuple[int, ...] = (24, 116, 232, 464, 1024),
                 classes: int = 1000) -> None:
        super().__init__()
        self.conv1 = conv_bn(3, channels[0], 3, 2)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages: list[nn.Module] = []
        cin = channels[0]
        for n, cout in zip(repeats, channels[1:4]):
            stages.append(nn.Sequential(*[ShuffleUnit(cin if i == 0 else cout, cout, 2 if i == 0 else 1)
                                          for i in range(n)]))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.conv5 = conv_bn(cin, channels[4], 1)
        self.fc = nn.Linear(channels[4], classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv5(self.stages(self.maxpool(self.conv1(x))))
        return self.fc(x.mean([2, 3]))
