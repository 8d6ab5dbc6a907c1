"""Training programs against torch.autograd and torch.optim: gradients, loss curves, frozen layers, clipping,
bad input."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import edgerun.training as T
from edgerun.errors import EdgerunError
from edgerun.zoo.digits_cnn import DigitsCNN
from edgerun.zoo.mlp import MLP

# float32 on both sides, different summation orders: gradients agree to this fraction of their largest entry
GRAD_TOL = 2e-5


def _batches(n: int, batch: int = 16, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 1, 8, 8, generator=gen), torch.randint(0, 10, (batch,), generator=gen))
            for _ in range(n)]


def _assert_grads_match(model: T.TrainingProgram, module: nn.Module, x: torch.Tensor, y: torch.Tensor,
                        loss_fn=nn.functional.cross_entropy) -> None:  # type: ignore[no-untyped-def]
    ours = model.gradients(x.numpy(), y.numpy())
    module.zero_grad()
    loss_fn(module(x), y).backward()
    checked = 0
    for name, p in module.named_parameters():
        if name not in ours:
            continue
        ref = p.grad.numpy()
        np.testing.assert_allclose(ours[name], ref, rtol=0, atol=GRAD_TOL * float(np.abs(ref).max()) + 1e-9,
                                   err_msg=name)
        checked += 1
    assert checked == len(ours) > 0


@pytest.mark.parametrize("make", [lambda: MLP(64, 32, 10), DigitsCNN], ids=["mlp", "digits-cnn"])
def test_gradients_of_every_parameter_equal_torch_autograd(make) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    module = make().eval()
    (x, y), = _batches(1)
    model = T.from_torch(module, (x,), optimizer=T.SGD(0.1))
    assert set(model.trainable) == {n for n, _ in module.named_parameters()}
    _assert_grads_match(model, module, x, y)
    kept = model.program.metadata["training"]["activation_bytes"]
    assert 0 < kept["kept_for_backward"] < kept["forward"]  # backward holds on to some activations, not all


@pytest.mark.parametrize("optimizer", [T.SGD(0.05, momentum=0.9, weight_decay=1e-3),
                                       T.Adam(3e-3, betas=(0.85, 0.99), eps=1e-7, weight_decay=1e-4)],
                         ids=["sgd", "adam"])
def test_fifty_steps_follow_torch_loss_curve(optimizer) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(1)
    module = DigitsCNN().eval()
    batches = _batches(4, seed=2) * 13  # four batches, seen again and again: the loss must fall
    model = T.from_torch(module, (batches[0][0],), optimizer=optimizer)
    if isinstance(optimizer, T.SGD):
        opt: torch.optim.Optimizer = torch.optim.SGD(module.parameters(), lr=optimizer.lr, momentum=optimizer.momentum,
                                                     weight_decay=optimizer.weight_decay)
    else:
        opt = torch.optim.Adam(module.parameters(), lr=optimizer.lr, betas=optimizer.betas, eps=optimizer.eps,
                               weight_decay=optimizer.weight_decay)
    ours, theirs = [], []
    for x, y in batches[:50]:
        ours.append(model.train_step(x.numpy(), y.numpy()))
        opt.zero_grad()
        loss = nn.functional.cross_entropy(module(x), y)
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    # the curves agree step by step to 1e-3 of the loss (float32 drift over 50 steps), and training happened
    np.testing.assert_allclose(ours, theirs, rtol=1e-3)
    assert ours[-1] < ours[0] - 0.1
    assert model.steps == 50
    final = {n: p.detach().numpy() for n, p in module.named_parameters()}
    for name, w in model.weights.items():
        np.testing.assert_allclose(w, final[name], rtol=0, atol=2e-3 * float(np.abs(final[name]).max()))


def test_frozen_layers_keep_their_weights_and_the_rest_match_torch() -> None:
    torch.manual_seed(3)
    module = DigitsCNN().eval()
    (x, y), = _batches(1)
    head = [n for n, _ in module.named_parameters() if n.startswith("head.")]
    model = T.from_torch(module, (x,), trainable_params=lambda n: n.startswith("head."), optimizer=T.SGD(0.1))
    assert model.trainable == head
    for name, p in module.named_parameters():
        p.requires_grad_(name in head)
    _assert_grads_match(model, module, x, y)
    before = model.program.methods["forward"].constants["features.0.weight"].copy()
    model.train_step(x.numpy(), y.numpy())
    assert np.array_equal(model.program.methods["forward"].constants["features.0.weight"], before)
    out = module(x).detach().numpy()
    assert not np.allclose(model.forward(x.numpy()), out, atol=1e-6)  # the head moved


def test_clipping_and_a_learning_rate_given_per_step_match_torch() -> None:
    torch.manual_seed(4)
    module = MLP(64, 16, 10).eval()
    (x, y), = _batches(1)
    model = T.from_torch(module, (x,), optimizer=T.SGD(0.5), clip_norm=0.01)
    model.train_step(x.numpy(), y.numpy(), lr=0.2)
    opt = torch.optim.SGD(module.parameters(), lr=0.2)
    nn.functional.cross_entropy(module(x), y).backward()
    norm = torch.nn.utils.clip_grad_norm_(module.parameters(), 0.01)
    assert norm > 0.01  # clipping did something
    opt.step()
    for name, p in module.named_parameters():
        np.testing.assert_allclose(model.weights[name], p.detach().numpy(), rtol=0, atol=1e-6)
    before = model.weights
    model.train_step(x.numpy(), y.numpy(), lr=0.0)
    assert all(np.array_equal(before[n], w) for n, w in model.weights.items())


def test_mse_and_a_loss_function_exported_with_the_module() -> None:
    torch.manual_seed(5)
    module = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).eval()
    x, t = torch.randn(5, 6), torch.randn(5, 3)
    mse = T.from_torch(module, (x,), loss="mse", optimizer=T.SGD(0.1))
    _assert_grads_match(mse, module, x, t, nn.functional.mse_loss)

    def smooth_l1(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.smooth_l1_loss(out, target, beta=0.5)

    own = T.from_torch(module, (x,), loss=smooth_l1, example_targets=t, optimizer=T.SGD(0.1))
    _assert_grads_match(own, module, x, t, smooth_l1)
    assert own.evaluate(x.numpy(), t.numpy()) == pytest.approx(smooth_l1(module(x), t).item(), rel=1e-5)
    assert np.allclose(own.forward(x.numpy()), module(x).detach().numpy(), atol=1e-6)


def test_bad_requests_are_refused_with_one_line_errors() -> None:
    import edgerun

    assert edgerun.training.trainable is T.trainable  # the public names, reached from a bare `import edgerun`
    assert (edgerun.training.SGD, edgerun.training.Adam) == (T.SGD, T.Adam)
    with pytest.raises(EdgerunError, match="momentum"):
        T.SGD(0.1, momentum=1.5)
    module = MLP(64, 16, 10).eval()
    (x, _), = _batches(1)
    program, _ = T.export_for_training(module, (x,))
    with pytest.raises(EdgerunError, match=r"unknown trainable .net\.9\.weight."):
        T.trainable(program, trainable=["net.9.weight"])
    with pytest.raises(EdgerunError, match="is an input of the program"):
        T.trainable(program, trainable=[program.graph.inputs[0]])
    with pytest.raises(EdgerunError, match="must be a float scalar"):
        T.trainable(program, loss=program.graph.outputs[0])
    with pytest.raises(EdgerunError, match="unknown loss 'hinge'"):
        T.trainable(program, loss="hinge")
    ids = nn.Embedding(10, 4)
    emb_program, _ = T.export_for_training(ids, (torch.tensor([[1, 2]]),), loss="mse")
    with pytest.raises(EdgerunError, match=r"input of the program .*int64"):
        T.trainable(emb_program, loss="mse", trainable=[emb_program.graph.inputs[0]])


def test_a_non_finite_loss_skips_the_step_and_says_so() -> None:
    module = MLP(64, 16, 10).eval()
    (x, y), = _batches(1)
    model = T.from_torch(module, (x,), optimizer=T.Adam(1e-2))
    before = model.weights
    bad = x.numpy().copy()
    bad[0, 0, 0, 0] = np.nan
    with pytest.warns(RuntimeWarning, match="train step skipped"):
        loss = model.train_step(bad, y.numpy())
    assert np.isnan(loss) and model.skipped_steps == 1 and model.steps == 0
    assert all(np.array_equal(before[n], w) for n, w in model.weights.items())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.train_step(x.numpy(), y.numpy())
    assert model.steps == 1 and all(np.isfinite(w).all() for w in model.weights.values())


def test_din_gradients_equal_torch_autograd_padded_embeddings_included() -> None:
    from edgerun.zoo.din import DIN, example_inputs

    torch.manual_seed(6)
    module = DIN(items=300, categories=20).eval()
    inputs = tuple(torch.cat([i] * 4) for i in example_inputs(items=300, categories=20))
    clicks = torch.tensor([1.0, 0.0, 1.0, 0.0])
    model = T.from_torch(module, inputs, loss=nn.functional.binary_cross_entropy, example_targets=clicks,
                         optimizer=T.SGD(0.1))
    ours = model.gradients(*(i.numpy() for i in inputs), clicks.numpy())
    module.zero_grad()
    nn.functional.binary_cross_entropy(module(*inputs), clicks).backward()
    assert set(ours) == {n for n, _ in module.named_parameters()}
    for name, p in module.named_parameters():
        ref, got = p.grad.numpy(), ours[name]
        np.testing.assert_allclose(got, ref, rtol=0, atol=GRAD_TOL * float(np.abs(ref).max()) + 1e-9, err_msg=name)
    assert not ours["item_emb.weight"][0].any()  # padding_idx=0: the padding row takes no gradient, as in torch


def test_the_backward_graph_runs_on_onnx_runtime_like_any_graph() -> None:
    torch.manual_seed(7)
    module = DigitsCNN().eval()
    (x, y), = _batches(1, batch=8)
    on_ort = T.from_torch(module, (x,), optimizer=T.SGD(0.1), backends=["onnxruntime"])
    step = on_ort.loaded.method("train_step")
    assert {p.backend for p in step.partitions} == {"onnxruntime"}  # no training-only code: ordinary IR
    _assert_grads_match(on_ort, module, x, y)
