"""A real task on data shipped in a package: scikit-learn's bundled 8x8 digits, trained on the device.

The full run (a wider CNN from scratch to >= 97% held-out, 20 epochs) is bench/training.py --digits; here a
small CNN learns for a few epochs, then a head is fine-tuned on frozen features and its weights file loaded
into the inference program."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import edgerun
import edgerun.training as T
from edgerun.zoo.digits_cnn import DigitsCNN, digits

BATCH = 32


def _epochs(model: T.TrainingProgram, x: np.ndarray, y: np.ndarray, epochs: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for i in range(0, len(order) - BATCH + 1, BATCH):
            model.train_step(x[order[i:i + BATCH]], y[order[i:i + BATCH]])


def _accuracy(run, x: np.ndarray, y: np.ndarray) -> float:  # type: ignore[no-untyped-def]
    return float((np.asarray(run(x)).argmax(1) == y).mean())


def test_digits_cnn_learns_then_a_fine_tuned_head_ships_as_a_weights_file(tmp_path: Path) -> None:
    (xtr, ytr), (xte, yte) = digits()
    xtr_n, ytr_n, xte_n, yte_n = xtr.numpy(), ytr.numpy(), xte.numpy(), yte.numpy()
    torch.manual_seed(0)
    module = DigitsCNN().eval()
    inference, _ = T.export_for_training(module, (xte,))  # the deployed program: the whole held-out set a call
    at_batch, _ = T.export_for_training(module, (xtr[:BATCH],))

    # from scratch, features and head, on the digits 0-4 alone
    model = T.trainable(at_batch, optimizer=T.Adam(1e-2))
    low = ytr_n < 5
    _epochs(model, xtr_n[low], ytr_n[low], epochs=4)
    pretrained = model.weights
    before = _accuracy(edgerun.load(T.apply_weights(inference, pretrained)), xte_n, yte_n)
    assert 0.35 < before < 0.6  # the five classes it knows, not the rest

    # fine-tune only the head on all ten digits, the features frozen
    features = {n: w for n, w in pretrained.items() if n.startswith("features.")}
    tuned = T.trainable(T.apply_weights(at_batch, features, optimize=False),
                        trainable=lambda n: n.startswith("head."), optimizer=T.Adam(1e-2))
    _epochs(tuned, xtr_n, ytr_n, epochs=4, seed=1)
    path = tmp_path / "head.weights"
    tuned.save_weights(path)
    assert set(T.read_weights(path)) == {"head.1.weight", "head.1.bias", "head.3.weight", "head.3.bias"}

    deployed = edgerun.load(T.apply_weights(T.apply_weights(inference, features, optimize=False), path))
    assert _accuracy(deployed, xte_n, yte_n) > 0.85  # frozen features, a head fine-tuned on the device
    # the inference program loaded with the file gives the training program's outputs
    np.testing.assert_allclose(np.asarray(deployed(xte_n))[:BATCH], tuned.forward(xte_n[:BATCH]),
                               rtol=1e-4, atol=1e-5)
    assert all(np.array_equal(tuned.program.methods["forward"].constants[n], w) for n, w in features.items())
