"""A small CNN for 8x8 grey-scale digits (scikit-learn's bundled digits): the on-device training example.

conv 3x3 (c1) - relu - max pool 2 - conv 3x3 (c2) - relu - avg pool 2 - linear (4 c2 -> hidden) - relu -
linear (10). The default widths (8, 16, 32) keep the gradient tests cheap; (32, 64, 128) is the width that
reaches 98% on held-out digits (bench/training.py --digits).
"""

from __future__ import annotations

import torch
from torch import nn


class DigitsCNN(nn.Module):
    def __init__(self, c1: int = 8, c2: int = 16, hidden: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * c2, hidden), nn.ReLU(), nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def digits(seed: int = 0) -> tuple[tuple[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """scikit-learn's 1,797 bundled 8x8 digits scaled to [0, 1], split 80/20 at random by `seed`:
    ((train images [N, 1, 8, 8], train labels int64), (held-out images, held-out labels))."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = torch.tensor(data.images / 16.0, dtype=torch.float32).unsqueeze(1)
    labels = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    cut = int(len(labels) * 0.8)
    train, test = order[:cut], order[cut:]
    return (images[train], labels[train]), (images[test], labels[test])
