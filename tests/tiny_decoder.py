"""A two-method torch module with a cache buffer, shared by the state/method export and quantization tests."""

from __future__ import annotations

import torch
from torch import nn


class TinyDecoder(nn.Module):
    """prefill writes the first rows of a cache; decode writes row `pos` and attends over the cache."""

    def __init__(self, width: int = 128, rows: int = 8) -> None:
        super().__init__()
        self.embed = nn.Linear(width, width)
        self.head = nn.Linear(width, width)
        self.rows = rows
        self.register_buffer("cache", torch.zeros(rows, width))

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        k = self.embed(x)
        self.cache[: x.shape[0]] = k
        return self.head(k)[-1:]

    def decode(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        k = self.embed(x)
        row = (torch.arange(self.rows) == pos).unsqueeze(1)
        self.cache.copy_(torch.where(row, k, self.cache))
        weights = torch.softmax(self.cache @ k.T / 8.0, dim=0)
        return self.head((weights * self.cache).sum(0, keepdim=True))
