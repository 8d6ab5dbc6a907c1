"""A small multilayer perceptron (flattened 28x28 input, two hidden layers)."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, inputs: int = 784, hidden: int = 256, classes: int = 10) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.GELU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.net(x), dim=-1)


def example_inputs() -> tuple[torch.Tensor, ...]:
    from edgerun.zoo.inputs import natural_image

    # A grey-scale digit-sized picture: the first channel of a natural image, cropped to 28x28.
    return (natural_image(28, seed=7)[:, :1].contiguous(),)
