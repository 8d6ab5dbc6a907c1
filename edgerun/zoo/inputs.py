"""Real-looking example inputs: natural-image-like pictures, token ids, recommendation histories."""

from __future__ import annotations

from typing import Any

import numpy as np

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


def natural_image(size: int = 224, seed: int = 0, batch: int = 1) -> Any:
    """A batch of pictures with natural-image statistics, ImageNet-normalised, as a float32 torch tensor.

    Smooth colour gradients plus soft blobs plus a little sensor noise: spatially correlated like photos,
    unlike N(0,1) noise, so activations and BatchNorm statistics look like those of real inputs.
    """
    import torch

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) / size
    images = []
    for _ in range(batch):
        img = np.empty((3, size, size), np.float32)
        for c in range(3):
            a, b, base = rng.uniform(-0.5, 0.5, 3)
            img[c] = 0.5 + base * 0.3 + a * (xx - 0.5) + b * (yy - 0.5)
        for _ in range(6):
            cy, cx = rng.uniform(0, 1, 2)
            radius = rng.uniform(0.05, 0.3)
            colour = rng.uniform(-0.4, 0.4, 3).astype(np.float32)
            blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * radius**2))
            img += colour[:, None, None] * blob[None]
        img += rng.normal(0, 0.02, img.shape).astype(np.float32)
        img = np.clip(img, 0, 1)
        images.append((img - IMAGENET_MEAN[:, None, None]) / IMAGENET_STD[:, None, None])
    return torch.from_numpy(np.stack(images).astype(np.float32))


def token_ids(length: int, vocab: int, seed: int = 0) -> Any:
    """A prompt-like id sequence: a Zipf-distributed draw (frequent ids are small), shape (1, length)."""
    import torch

    rng = np.random.default_rng(seed)
    ids = np.minimum(rng.zipf(1.3, size=length), vocab - 1).astype(np.int64)
    ids[0] = 1  # a beginning-of-sequence id
    return torch.from_numpy(ids[None])
