"""The federated demo's data and model: scikit-learn's bundled 8x8 digits split non-IID across devices
(each device holds 2 or 3 classes), and a small MLP trained with edgerun's training programs."""

from __future__ import annotations

from typing import Any

import numpy as np

BATCH = 16


def digits_split(devices: int, seed: int = 0) -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    """([(images [n, 1, 8, 8] float32 in [0, 1], labels int64) per device], held-out (images, labels)).

    The 1,797 digits are split 80/20 at random by `seed`; device i holds the classes `device_classes` gives
    it, and each class's training samples are dealt in turn among the devices holding it."""
    from sklearn.datasets import load_digits

    data = load_digits()
    images = (data.images / 16.0).astype(np.float32)[:, None]
    labels = data.target.astype(np.int64)
    order = np.random.default_rng(seed).permutation(len(labels))
    cut = int(len(labels) * 0.8)
    train, test = order[:cut], order[cut:]
    classes = device_classes(devices)
    owned: list[list[int]] = [[] for _ in range(devices)]
    for c in range(10):
        holders = [i for i in range(devices) if c in classes[i]]
        if not holders:
            continue
        for k, index in enumerate(train[labels[train] == c]):
            owned[holders[k % len(holders)]].append(int(index))
    shards = [(images[sorted(ix)], labels[sorted(ix)]) for ix in owned]
    return shards, (images[test], labels[test])


def device_classes(devices: int) -> list[list[int]]:
    """The classes each device holds: 3, 2, 3, 2, ... classes dealt in turn from 0-9, then from 0-9 in steps
    of 3 (0, 3, 6, 9, 2, ...), and so on with steps 7 and 9: with 8 devices every class is on exactly two."""
    deck = [(step * k) % 10 for step in (1, 3, 7, 9) for k in range(10)] * (1 + devices // 16)
    out, at = [], 0
    for i in range(devices):
        size = 3 if i % 2 == 0 else 2
        out.append(sorted(set(deck[at:at + size])))
        at += size
    return out


def digits_model(seed: int = 0, lr: float = 0.1) -> tuple[Any, Any, dict[str, np.ndarray]]:
    """(the training program at batch BATCH, the torch module it came from, its initial weights)."""
    import torch
    from torch import nn

    import edgerun.training as T

    torch.manual_seed(seed)
    module = nn.Sequential(nn.Flatten(), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
    model = T.from_torch(module, (torch.zeros(BATCH, 1, 8, 8),), loss="cross_entropy", optimizer=T.SGD(lr))
    return model, module, model.weights


def accuracy(model: Any, weights: dict[str, np.ndarray], images: np.ndarray, labels: np.ndarray) -> float:
    """Held-out accuracy of `weights`, run by the training program's forward in batches (the last one padded)."""
    model.loaded.set_state(**weights)
    right = 0
    for i in range(0, len(labels), BATCH):
        chunk = images[i:i + BATCH]
        padded = np.concatenate([chunk, np.zeros((BATCH - len(chunk), *chunk.shape[1:]), np.float32)])
        scores = np.asarray(model.forward(padded))[:len(chunk)]
        right += int(np.sum(scores.argmax(axis=1) == labels[i:i + BATCH]))
    return right / len(labels)


def direct_fedavg(model: Any, initial: dict[str, np.ndarray], shards: list[tuple[np.ndarray, np.ndarray]],
                  sampled_per_round: list[list[int]], seed: int, epochs: int, mu: float = 0.0,
                  server_lr: float = 1.0) -> list[dict[str, np.ndarray]]:
    """The reference: FedAvg computed here, in numpy, from the same seeds and data (each round's global
    weights), without the fleet."""
    from edgerun.fleet.federated.fedavg import fedavg
    from edgerun.fleet.federated.local import local_update

    weights, out = initial, []
    for r, sampled in enumerate(sampled_per_round, start=1):
        updates = []
        for i in sampled:
            delta, n = local_update(model, weights, *shards[i], epochs=epochs, seed=(seed, r), mu=mu)
            updates.append((str(i), delta, n))
        weights = fedavg(weights, updates, r, server_lr=server_lr)
        out.append(weights)
    return out
