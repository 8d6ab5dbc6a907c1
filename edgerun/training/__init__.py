"""On-device training: training programs over an inference program's weights (docs/training.md).

    model = edgerun.training.trainable(program, loss="cross_entropy", optimizer=edgerun.training.Adam(1e-3))
    loss = model.train_step(images, labels)
    model.forward(images)
    model.save_weights("tuned.weights")
"""

from edgerun.training.checkpoint import apply_weights, read_weights, write_weights
from edgerun.training.optimizers import SGD, Adam
from edgerun.training.program import TrainingProgram, trainable
from edgerun.training.torch_module import export_for_training, from_torch

__all__ = ["SGD", "Adam", "TrainingProgram", "apply_weights", "export_for_training", "from_torch", "read_weights", "trainable", "write_weights"]
