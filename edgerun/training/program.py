"""`trainable(program, ...)`: a loaded training program with forward, train_step and evaluate."""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.program import Program
from edgerun.runtime.methods import RunnableProgram
from edgerun.search import load
from edgerun.training.build import TrainableSpec, TrainingLayout, build_training_program
from edgerun.training.checkpoint import read_weights, write_weights
from edgerun.training.optimizers import SGD, Optimizer, optimizer_from_json


class TrainingProgram:
    """A loaded training program. The weights and the optimizer's moments live in its state and change in
    place with each `train_step`; `forward` always runs with the current weights."""

    def __init__(self, program: Program, layout: TrainingLayout, optimizer: Optimizer,
                 backends: Sequence[str] | str | None = None) -> None:
        self.program = program  # the training program as built (its state: the initial values)
        self.layout = layout
        self.optimizer = optimizer
        self.loaded: RunnableProgram = load(program, backends)
        self.skipped_steps = 0  # steps left out because the loss or a gradient was not finite

    @classmethod
    def read(cls, path: str | os.PathLike[str], backends: Sequence[str] | str | None = None) -> TrainingProgram:
        """A training program saved with `model.save(path)`, with the state it was saved with:
        training resumes where it stopped (numpy alone: no torch needed on the device)."""
        program = Program.read(path)
        record = program.metadata.get("training")
        if not isinstance(record, dict) or set(program.methods) != {"forward", "train_step", "evaluate", "gradients"}:
            raise EdgerunError(f"{os.fspath(path)!r} is not a training program")
        optimizer = optimizer_from_json(record.get("optimizer"))
        layout = TrainingLayout(tuple(program.methods["forward"].inputs), tuple(program.methods["evaluate"].inputs),
                                tuple(record["trainable"]), optimizer.slots())
        return cls(program, layout, optimizer, backends)

    @property
    def trainable(self) -> list[str]:
        return list(self.layout.trainable)

    def forward(self, *inputs: np.ndarray) -> Any:
        """The model's outputs with the current weights (one array, or a tuple of them)."""
        return self.loaded.method("forward")(*inputs)

    __call__ = forward

    def train_step(self, *arrays: np.ndarray, lr: float | None = None) -> float:
        """One optimizer step on a batch: the model's inputs, then the targets (for "cross_entropy" and
        "mse"); returns the batch's mean loss before the step. `lr` overrides the optimizer's learning rate
        for this step (a schedule). A step whose loss or gradients are not finite changes nothing, is
        counted in `skipped_steps` and warned about."""
        rate = np.float32(self.optimizer.lr if lr is None else lr)
        if not np.isfinite(rate) or rate < 0:
            raise EdgerunError(f"the learning rate must be finite and >= 0, got {lr}")
        loss, applied = self.loaded.method("train_step")(*arrays, np.asarray(rate, np.float32))
        value = float(np.asarray(loss).reshape(()))
        if not bool(np.asarray(applied).reshape(())):
            self.skipped_steps += 1
            warnings.warn(f"train step skipped: the loss is {value} or a gradient is not finite; the weights are "
                          "unchanged", RuntimeWarning, stacklevel=2)
        return value

    def evaluate(self, *arrays: np.ndarray) -> float:
        """The batch's mean loss with the current weights (inputs, then targets), changing nothing."""
        return float(np.asarray(self.loaded.method("evaluate")(*arrays)).reshape(()))

    def gradients(self, *arrays: np.ndarray) -> dict[str, np.ndarray]:
        """The gradient of the batch's mean loss for each trained weight, by name, changing nothing."""
        results = self.loaded.method("gradients")(*arrays)
        return {name: np.array(g) for name, g in zip(self.layout.trainable, results[1:])}

    @property
    def weights(self) -> dict[str, np.ndarray]:
        """A copy of each trained weight's current value, by name."""
        state = self.loaded.state
        return {name: np.array(state[name]) for name in self.layout.trainable}

    @property
    def steps(self) -> int:
        """Steps applied so far."""
        from edgerun.training.build import STEP_STATE

        return int(self.loaded.state[STEP_STATE])

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the training program with its current state (weights, moments, step count) as a program
        file; `TrainingProgram.read(path)` resumes from it."""
        current = {name: np.array(value) for name, value in self.loaded.state.items()}
        Program.from_methods(self.program.methods, default_method=self.program.default_method, state=current,
                             metadata=dict(self.program.metadata)).save(path)

    def save_weights(self, path: str | os.PathLike[str]) -> None:
        """Write the trained weights as a weights file (checkpoint.py) that an inference program loads."""
        write_weights(path, self.weights, source=self.program.metadata.get("name"))

    def load_weights(self, path: str | os.PathLike[str]) -> None:
        """Replace trained weights by those of a weights file (every name must be one of this program's)."""
        weights = read_weights(path)
        unknown = sorted(set(weights) - set(self.layout.trainable))
        if unknown:
            raise EdgerunError(f"the weights file holds {unknown[:5]}, which this program does not train")
        current = self.loaded.state
        for name, array in weights.items():
            if array.shape != current[name].shape or array.dtype != current[name].dtype:
                raise EdgerunError(f"weight {name!r} in the file is {array.dtype}{list(array.shape)}, the program's "
                                   f"is {current[name].dtype}{list(current[name].shape)}")
        self.loaded.set_state(**weights)


def trainable(program: Program | str | os.PathLike[str], loss: str = "cross_entropy",
              trainable: TrainableSpec = None, optimizer: Optimizer | None = None, *,
              clip_norm: float | None = None, backends: Sequence[str] | str | None = None,
              recompute: bool = True, activation_budget: int | None = None) -> TrainingProgram:
    """A training program from an inference program (a Program or a program file).

    `loss`: "cross_entropy" (the first output holds [batch, classes] scores; targets are int64 classes),
    "mse" (targets shaped like the first output), or the name of a scalar output of the program (its own
    loss: every input it reads is an input of train_step). `trainable`: weight names, a filter over them
    (frozen layers are the weights it leaves out), or None for every float weight of rank >= 1.
    `optimizer`: SGD or Adam (default SGD(0.01)). `clip_norm`: clip the gradients' global norm to this.
    `recompute`: compute cheap elementwise activations again in backward rather than keep them
    (passes/autodiff.py, recompute_cheap); False keeps every activation backward reads.
    `activation_budget`: at most this many bytes of forward activations kept for backward; more of them
    (matmul and convolution outputs included) are computed again in backward to fit, cheapest per byte
    first (recompute_to_budget). A budget below what must be kept is a RuntimeWarning naming that floor.
    """
    if not isinstance(program, Program):
        program = Program.read(program)
    optimizer = optimizer if optimizer is not None else SGD()
    built, layout = build_training_program(program, loss, trainable, optimizer, clip_norm, recompute,
                                           activation_budget)
    return TrainingProgram(built, layout, optimizer, backends)
