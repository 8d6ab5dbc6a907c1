"""Weights files: fine-tuned weights saved, validated, and loaded by name into the inference program."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import edgerun
import edgerun.training as T
from edgerun.errors import EdgerunError, ProgramFormatError
from edgerun.zoo.mlp import MLP


def test_fine_tuned_head_loads_into_the_inference_program_by_name(tmp_path: Path) -> None:
    torch.manual_seed(0)
    module = MLP(64, 16, 10).eval()
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    inference, _ = T.export_for_training(module, (x,))
    model = T.trainable(inference, trainable=lambda n: n.startswith("net.5."), optimizer=T.SGD(0.5))
    for _ in range(3):
        model.train_step(x.numpy(), y.numpy())
    path = tmp_path / "head.weights"
    model.save_weights(path)
    assert sorted(T.read_weights(path)) == ["net.5.bias", "net.5.weight"]

    before = edgerun.load(inference)(x.numpy())
    tuned = edgerun.load(T.apply_weights(inference, path))(x.numpy())
    np.testing.assert_allclose(tuned, model.forward(x.numpy()), rtol=1e-5, atol=1e-6)
    assert not np.allclose(tuned, before, atol=1e-4)

    fresh = T.trainable(inference, trainable=lambda n: n.startswith("net.5."))
    fresh.load_weights(path)  # training resumes from the file
    np.testing.assert_allclose(fresh.forward(x.numpy()), tuned, rtol=1e-5, atol=1e-6)


def test_weights_files_are_validated(tmp_path: Path) -> None:
    path = tmp_path / "w.weights"
    T.write_weights(path, {"a": np.arange(64, dtype=np.float32)})
    data = bytearray(path.read_bytes())
    data[-8] ^= 0xFF  # a flipped bit in the weights: the checksum catches it
    bad = tmp_path / "bad.weights"
    bad.write_bytes(bytes(data))
    with pytest.raises(ProgramFormatError):
        T.read_weights(bad)
    program, _ = T.export_for_training(MLP(64, 16, 10).eval(), (torch.randn(2, 1, 8, 8),))
    program.save(tmp_path / "model.edgerun")
    with pytest.raises(ProgramFormatError, match="not a weights file"):
        T.read_weights(tmp_path / "model.edgerun")
    with pytest.raises(EdgerunError, match="no weight 'a'"):
        T.apply_weights(program, path)
    with pytest.raises(EdgerunError, match=r"float32\[10\] in the file"):
        T.apply_weights(program, {"net.5.weight": np.zeros(10, np.float32)})


def test_a_saved_training_program_resumes_where_it_stopped(tmp_path: Path) -> None:
    torch.manual_seed(1)
    module = MLP(64, 16, 10).eval()
    x, y = torch.randn(8, 1, 8, 8).numpy(), torch.randint(0, 10, (8,)).numpy()
    model = T.from_torch(module, (torch.from_numpy(x),), optimizer=T.Adam(1e-2, betas=(0.8, 0.99)))
    for _ in range(3):
        model.train_step(x, y)
    model.save(tmp_path / "training.edgerun")
    resumed = T.TrainingProgram.read(tmp_path / "training.edgerun")
    assert resumed.optimizer == model.optimizer and resumed.steps == 3
    assert resumed.train_step(x, y) == model.train_step(x, y)  # the moments came along too
    for name, w in model.weights.items():
        np.testing.assert_array_equal(resumed.weights[name], w)
    with pytest.raises(EdgerunError, match="not a training program"):
        program, _ = T.export_for_training(module, (torch.from_numpy(x),))
        program.save(tmp_path / "plain.edgerun")
        T.TrainingProgram.read(tmp_path / "plain.edgerun")
