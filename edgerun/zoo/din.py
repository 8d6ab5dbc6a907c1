"""DIN (Zhou et al. 2018, Deep Interest Network): a recommendation model over integer id inputs.

Embeddings of the user's behaviour sequence (item and category ids, 0 = padding) and of a target item; a
local activation unit scores each behaviour against the target; the weighted sum pools the history; an
MLP predicts the click probability.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class PReLU(nn.Module):
    """PReLU over the last axis (torch's nn.PReLU puts channels on axis 1, which sequences do not)."""

    def __init__(self, features: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.full((features,), 0.25))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.where(x > 0, x, self.weight * x)


class ActivationUnit(nn.Module):
    def __init__(self, dim: int, hidden: int = 36) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim * 4, hidden), PReLU(hidden), nn.Linear(hidden, 1))

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        q = query.unsqueeze(1).expand_as(keys)
        return self.mlp(torch.cat([q, keys, q - keys, q * keys], dim=-1)).squeeze(-1)


class DIN(nn.Module):
    def __init__(self, items: int = 5000, categories: int = 200, dim: int = 16) -> None:
        super().__init__()
        self.item_emb = nn.Embedding(items, dim, padding_idx=0)
        self.cat_emb = nn.Embedding(categories, dim, padding_idx=0)
        self.attention = ActivationUnit(dim * 2)
        self.mlp = nn.Sequential(nn.Linear(dim * 4, 200), PReLU(200), nn.Linear(200, 80), PReLU(80),
                                 nn.Linear(80, 1))

    def forward(self, hist_items: torch.Tensor, hist_cats: torch.Tensor, target_item: torch.Tensor,
                target_cat: torch.Tensor) -> torch.Tensor:
        keys = torch.cat([self.item_emb(hist_items), self.cat_emb(hist_cats)], dim=-1)
        query = torch.cat([self.item_emb(target_item), self.cat_emb(target_cat)], dim=-1)
        scores = self.attention(query, keys)
        scores = scores.masked_fill(hist_items == 0, 0.0)  # DIN keeps raw (unnormalised) weights
        interest = (scores.unsqueeze(-1) * keys).sum(dim=1)
        logit = self.mlp(torch.cat([interest, query], dim=-1))
        return torch.sigmoid(logit).squeeze(-1)


def example_inputs(length: int = 20, items: int = 5000, categories: int = 200) -> tuple[torch.Tensor, ...]:
    rng = np.random.default_rng(3)
    used = 14  # a history shorter than the window: the tail is padding (id 0)
    hist_items = np.zeros((1, length), np.int64)
    hist_cats = np.zeros((1, length), np.int64)
    hist_items[0, :used] = rng.integers(1, items, used)
    hist_cats[0, :used] = hist_items[0, :used] % (categories - 1) + 1
    target_item = rng.integers(1, items, (1,))
    target_cat = target_item % (categories - 1) + 1
    return (torch.from_numpy(hist_items), torch.from_numpy(hist_cats), torch.from_numpy(target_item),
            torch.from_numpy(target_cat))
