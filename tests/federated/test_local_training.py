"""A device's local training: E epochs from the global weights, FedProx's proximal term, against torch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgerun.training as T
from edgerun.fleet.errors import FleetError
from edgerun.fleet.federated.local import epoch_batches, local_update


@pytest.mark.parametrize("mu", [0.0, 0.5])
def test_local_update_matches_torch_sgd_on_the_fedprox_objective(mu: float) -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10)).eval()
    rng = np.random.default_rng(0)
    images = rng.random((44, 1, 8, 8), dtype=np.float32)
    labels = rng.integers(0, 10, 44).astype(np.int64)
    model = T.from_torch(module, (torch.zeros(8, 1, 8, 8),), loss="cross_entropy", optimizer=T.SGD(0.1))
    start = {n: p.detach().numpy() + np.float32(0.01) for n, p in module.named_parameters()}  # the global model
    delta, samples = local_update(model, start, images, labels, epochs=2, seed=(7, 3), mu=mu)
    assert samples == 44

    with torch.no_grad():
        for n, p in module.named_parameters():
            p.copy_(torch.from_numpy(start[n]))
    anchor = {n: torch.from_numpy(start[n]) for n in start}
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    for epoch in range(2):
        for idx in epoch_batches(44, 8, (7, 3, epoch)):  # 5 full batches; 4 samples left out each epoch
            opt.zero_grad()
            loss = nn.functional.cross_entropy(module(torch.from_numpy(images[idx])), torch.from_numpy(labels[idx]))
            loss = loss + mu / 2 * sum(((p - anchor[n]) ** 2).sum() for n, p in module.named_parameters())
            loss.backward()
            opt.step()
    for n, p in module.named_parameters():
        expect = p.detach().numpy() - start[n]
        np.testing.assert_allclose(delta[n], expect, atol=2e-5 * max(1e-3, float(np.abs(expect).max())) + 1e-6)


def test_too_little_local_data_is_refused() -> None:
    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 10)).eval()
    model = T.from_torch(module, (torch.zeros(8, 1, 8, 8),), loss="cross_entropy")
    start = {n: p.detach().numpy() for n, p in module.named_parameters()}
    with pytest.raises(FleetError, match="fewer than one batch of 8"):
        local_update(model, start, np.zeros((5, 1, 8, 8), np.float32), np.zeros(5, np.int64))
