"""A device's part of a round: train the global model for E local epochs on local data, return the delta.

The training program is an edgerun one (edgerun.training), so local training runs on the device's own
runtime. Batches have the program's fixed batch size; the local samples are shuffled each epoch by a seed
the server chooses per (round, device), and a last partial batch is left out. The sample count reported
with the update is the number of local samples (FedAvg's n_k).

FedProx (`mu` > 0) adds (mu / 2) ||w − w_global||² to the local loss. Its gradient, mu (w − w_global), is
taken as its own step after each optimizer step, from the weights the step started at: for plain SGD this
is exactly one step on the FedProx objective.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from edgerun.fleet.errors import FleetError
from edgerun.training import TrainingProgram


def epoch_batches(samples: int, batch: int, epoch_seed: tuple[int, ...]) -> list[np.ndarray]:
    """The index batches of one epoch: a permutation by the seed, cut into full batches."""
    order = np.random.default_rng(list(epoch_seed)).permutation(samples)
    return [order[i:i + batch] for i in range(0, samples - batch + 1, batch)]


def local_update(model: TrainingProgram, global_weights: Mapping[str, np.ndarray], images: np.ndarray,
                 labels: np.ndarray, *, epochs: int = 1, seed: tuple[int, ...] = (0,), mu: float = 0.0,
                 lr: float | None = None) -> tuple[dict[str, np.ndarray], int]:
    """(delta per trained weight, sample count) after `epochs` epochs from `global_weights`."""
    batch = batch_size(model)
    if len(images) != len(labels):
        raise FleetError(f"{len(images)} local images but {len(labels)} labels")
    if len(images) < batch:
        raise FleetError(f"{len(images)} local samples are fewer than one batch of {batch}")
    start = {name: np.array(global_weights[name]) for name in model.trainable}
    model.loaded.set_state(**start)
    rate = model.optimizer.lr if lr is None else lr
    for epoch in range(epochs):
        for idx in epoch_batches(len(images), batch, (*seed, epoch)):
            before = model.weights if mu else None
            model.train_step(images[idx], labels[idx], lr=lr)
            if before is not None:
                after = model.weights
                model.loaded.set_state(**{n: (after[n] - np.float32(rate * mu) * (before[n] - start[n])).astype(
                    after[n].dtype) for n in after})
    final = model.weights
    return {name: final[name] - start[name] for name in model.trainable}, len(images)


def batch_size(model: TrainingProgram) -> int:
    """The fixed batch size of the training program (its first input's first dimension)."""
    graph = model.program.methods["forward"]
    return int(graph.specs[graph.inputs[0]].shape[0])
