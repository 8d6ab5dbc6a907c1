"""passes/conv_over_windows.py: a training step's stride-1 conv2d is computed as one matrix product over the
im2col windows its weight cotangent lays out, laid out once; gradients and steps still equal torch's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import edgerun.training as T
from edgerun.zoo.digits_cnn import DigitsCNN


def _grads_match(model: T.TrainingProgram, module: nn.Module, x: torch.Tensor, y: torch.Tensor) -> None:
    ours = model.gradients(x.numpy(), y.numpy())
    module.zero_grad()
    nn.functional.cross_entropy(module(x), y).backward()
    for name, p in module.named_parameters():
        ref = p.grad.numpy()
        np.testing.assert_allclose(ours[name], ref, rtol=0, atol=2e-5 * float(np.abs(ref).max()), err_msg=name)


@pytest.mark.parametrize("backend", ["reference", "onnxruntime"])
def test_a_digits_cnn_convolves_its_second_layer_over_the_windows_backward_reads(backend: str) -> None:
    torch.manual_seed(0)
    module, x, y = DigitsCNN(8, 16, 32).eval(), torch.rand(16, 1, 8, 8), torch.randint(0, 10, (16,))
    model = T.from_torch(module, (x,), optimizer=T.SGD(0.01), backends=[backend])
    for method in ("train_step", "gradients"):
        graph = model.program.methods[method]
        convs = [n for n in graph.nodes if n.op == "conv2d"]
        # the first layer's 1 x 3 x 3 windows are too few rows for a product: it stays a convolution
        assert [graph.specs[c.inputs[1]].shape for c in convs] == [(8, 1, 3, 3)]
        windows = [n for n in graph.nodes if n.op == "raster" and graph.specs[n.outputs[0]].shape == (72, 256)]
        assert len(windows) == 1  # laid out once, read by the forward product and the weight cotangent
    _grads_match(model, module, x, y)
    opt = torch.optim.SGD(module.parameters(), lr=0.01)
    for _ in range(3):  # each step's loss is torch's at the same weights
        opt.zero_grad()
        loss = nn.functional.cross_entropy(module(x), y)
        loss.backward()
        opt.step()
        np.testing.assert_allclose(model.train_step(x.numpy(), y.numpy()), loss.item(), rtol=1e-5)


def test_a_dilated_padded_conv_without_bias_gives_torch_gradients() -> None:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Conv2d(6, 5, (3, 2), padding=(1, 0), dilation=(1, 2), bias=False), nn.ReLU(),
                           nn.Flatten(), nn.Linear(5 * 6 * 5, 10)).eval()
    x, y = torch.randn(4, 6, 6, 7), torch.randint(0, 10, (4,))
    model = T.from_torch(module, (x,), optimizer=T.SGD(0.01), backends=["reference"])
    assert not any(n.op == "conv2d" for n in model.program.methods["train_step"].nodes)
    _grads_match(model, module, x, y)


def test_windows_too_large_to_keep_leave_the_convolution_as_it_is() -> None:
    # 16 x 3 x 3 rows by 2 x 48 x 48 columns: 663,552 elements, over the 2^18 the pass keeps from forward
    module = nn.Sequential(nn.Conv2d(16, 4, 3, padding=1), nn.Flatten(), nn.Linear(4 * 48 * 48, 10)).eval()
    x = torch.randn(2, 16, 48, 48)
    model = T.from_torch(module, (x,), optimizer=T.SGD(0.01), backends=["reference"])
    assert sum(n.op == "conv2d" for n in model.program.methods["train_step"].nodes) == 1
