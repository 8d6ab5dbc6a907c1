"""Flower interop: an edgerun training program as a Flower `NumPyClient`, so a team whose server already runs
Flower (https://flower.ai) trains on edgerun's on-device runtime without changing the server.

The client is built from the fleet's training task folder (training_task.py: `models/train.edgerun`,
`global.weights`, `federated.json`) and the device's local samples (an .npz of "images" and integer
"labels"). Each `fit` is exactly a fleet round's local training (local.py): E epochs from the weights the
server sent, batches shuffled by the seed (the fit config's "seed", then its "round"), FedProx's proximal
step when the task's `mu` > 0. It returns the trained weights themselves, as Flower's strategies expect,
with the local sample count (FedAvg's n_k). So Flower's FedAvg over these clients computes the same global
weights as edgerun's own federated job on the same data and seeds (tests/federated/test_flower.py).

Flower is not a dependency of edgerun: it pins older cryptography, FastAPI, Starlette, uvicorn and protobuf
than the fleet server runs, so it lives in its own virtual environment (`.venv-flower`, made by
scripts/setup.sh from requirements-flower.txt: numpy and flwr). This module imports flwr; everything else it
uses (the training program, local training) needs numpy alone, so that venv runs it with edgerun on
PYTHONPATH:

    PYTHONPATH=. .venv-flower/bin/python -m edgerun.fleet.federated.flower_client \\
        --server 127.0.0.1:8080 --task TASK_DIR --data samples.npz
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.client import NumPyClient

from edgerun.errors import EdgerunError
from edgerun.fleet.federated.local import batch_size, local_update
from edgerun.fleet.federated.training_task import PROGRAM_PATH, WEIGHTS_PATH
from edgerun.training import TrainingProgram, read_weights


class EdgerunNumPyClient(NumPyClient):  # type: ignore[misc]
    """A Flower client training `model` on (images, labels). Parameters travel as the list of the program's
    trained weights in `model.trainable` order."""

    def __init__(self, model: TrainingProgram, images: np.ndarray, labels: np.ndarray, *, epochs: int = 1,
                 mu: float = 0.0) -> None:
        if len(images) != len(labels):
            raise EdgerunError(f"{len(images)} local images but {len(labels)} labels")
        self.model, self.images, self.labels = model, images, labels
        self.epochs, self.mu = epochs, mu

    @classmethod
    def from_task(cls, task_dir: str | Path, data: str | Path) -> EdgerunNumPyClient:
        """The client of a training task folder, its settings (epochs, mu) and starting weights included,
        on the samples of an .npz file."""
        task_dir = Path(task_dir)
        settings = json.loads((task_dir / "federated.json").read_text())
        model = TrainingProgram.read(task_dir / PROGRAM_PATH)
        model.loaded.set_state(**read_weights(task_dir / WEIGHTS_PATH))
        with np.load(data, allow_pickle=False) as samples:
            images, labels = samples["images"], samples["labels"]
        return cls(model, images, labels, epochs=int(settings.get("epochs", 1)), mu=float(settings.get("mu", 0.0)))

    def _named(self, parameters: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        names = self.model.trainable
        if len(parameters) != len(names):
            raise EdgerunError(f"the server sent {len(parameters)} arrays; the training program trains "
                               f"{len(names)} ({', '.join(names)})")
        current = self.model.weights
        for name, array in zip(names, parameters):
            if np.shape(array) != current[name].shape:
                raise EdgerunError(f"the server's array for {name} has shape {np.shape(array)}, the program's "
                                   f"is {current[name].shape}")
        return {name: np.asarray(array, current[name].dtype) for name, array in zip(names, parameters)}

    def get_parameters(self, config: dict[str, Any]) -> list[np.ndarray]:
        weights = self.model.weights
        return [weights[name] for name in self.model.trainable]

    def fit(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[list[np.ndarray], int, dict[str, Any]]:
        """Local training from the server's weights; the fit config carries "round" and "seed" (both
        required: they fix the batch order, as a fleet round's do) and may override "epochs"."""
        missing = [key for key in ("round", "seed") if key not in config]
        if missing:
            raise EdgerunError(f"the fit config lacks {', '.join(missing)} (set on_fit_config_fn on the strategy)")
        start = self._named(parameters)
        delta, samples = local_update(self.model, start, self.images, self.labels,
                                      epochs=int(config.get("epochs", self.epochs)),
                                      seed=(int(config["seed"]), int(config["round"])), mu=self.mu)
        return [start[name] + delta[name] for name in self.model.trainable], samples, {}

    def evaluate(self, parameters: list[np.ndarray], config: dict[str, Any]) -> tuple[float, int, dict[str, Any]]:
        """Mean loss and accuracy of the server's weights on the local samples (full batches: the program's
        batch size is fixed)."""
        self.model.loaded.set_state(**self._named(parameters))
        batch = batch_size(self.model)
        full = len(self.labels) - len(self.labels) % batch
        if full == 0:
            raise EdgerunError(f"{len(self.labels)} local samples are fewer than one batch of {batch}")
        losses, right = [], 0
        for i in range(0, full, batch):
            images, labels = self.images[i:i + batch], self.labels[i:i + batch]
            losses.append(self.model.evaluate(images, labels))
            right += int(np.sum(np.asarray(self.model.forward(images)).argmax(axis=1) == labels))
        return float(np.mean(losses)), full, {"accuracy": right / full}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m edgerun.fleet.federated.flower_client",
                                     description="Run an edgerun training task as a Flower client.")
    parser.add_argument("--server", required=True, help="the Flower server's address, host:port")
    parser.add_argument("--task", required=True, help="the training task folder (training_task.py)")
    parser.add_argument("--data", required=True, help="the local samples: an .npz of images and labels")
    args = parser.parse_args(argv)
    from flwr.client import start_client

    try:
        client = EdgerunNumPyClient.from_task(args.task, args.data)
    except (OSError, KeyError, ValueError, EdgerunError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    start_client(server_address=args.server, client=client.to_client(), insecure=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
