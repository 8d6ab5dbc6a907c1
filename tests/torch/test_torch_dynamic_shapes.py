"""dynamic_shapes: one export with bounded torch.export.Dims runs at every shape within bounds, like eager."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.export import Dim

import edgerun
from edgerun.errors import EdgerunError
from edgerun.ir.specialize import ShapeBindingError
from edgerun.ir.symbolic import sym
from edgerun.program import FORMAT_MINOR, Program
from edgerun.runtime.specializing import SpecializingProgram

BATCH = Dim("batch", min=1, max=6)
SEQ = Dim("seq", min=2, max=48)


class TransformerBlock(nn.Module):
    """Pre-norm attention + MLP, learned positions by arange(seq), a mean over tokens divided by seq."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.pos = nn.Embedding(64, dim)
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, c = x.shape
        x = x + self.pos(torch.arange(t))
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        keep = mask[:, None, None, :] > 0
        y = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        x = x + self.mlp(self.ln2(x))
        return x, x[:, -1], x.sum(dim=1) / t


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AvgPool2d(2), nn.AdaptiveAvgPool2d(1))
        self.head = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.head(torch.flatten(self.features(x), 1)), dim=-1)


def _seeded(cls: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    model = cls()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return model.eval()


def _transformer_inputs(b: int, t: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(b, t, generator=g) > 0.2).float()
    mask[:, 0] = 1.0  # every row keeps at least one key
    return torch.randn(b, t, 32, generator=g), mask


@pytest.fixture(scope="module")
def transformer(tmp_path_factory: pytest.TempPathFactory) -> tuple[nn.Module, str]:
    model = _seeded(TransformerBlock)
    shapes = ({0: BATCH, 1: SEQ}, {0: BATCH, 1: SEQ})
    program = edgerun.export(model, _transformer_inputs(2, 8, 0), dynamic_shapes=shapes)
    path = str(tmp_path_factory.mktemp("dyn") / "block.edgerun")
    program.save(path)
    return model, path


@pytest.fixture(scope="module")
def cnn() -> tuple[nn.Module, Program]:
    model = _seeded(SmallCNN)
    shapes = ({0: BATCH, 2: Dim("h", min=16, max=96), 3: Dim("w", min=16, max=96)},)
    return model, edgerun.export(model, (torch.randn(2, 3, 40, 40),), dynamic_shapes=shapes)


def _close(ours: np.ndarray, theirs: torch.Tensor) -> None:
    ref = theirs.detach().numpy()
    assert ours.shape == ref.shape
    assert np.abs(ours - ref).max() <= 2e-5 * max(1.0, float(np.abs(ref).max()))


def test_transformer_file_is_a_template_with_named_bounded_symbols(transformer: tuple[nn.Module, str]) -> None:
    _, path = transformer
    program = Program.read(path)
    assert program.file_info is not None and program.file_info.format_version == (1, FORMAT_MINOR)
    assert program.graph.symbols == {"batch": (1, 6), "seq": (2, 48)}
    model = edgerun.load(path)
    assert isinstance(model, SpecializingProgram)
    assert model.input_names == ["x", "mask"]
    assert model.input_specs["x"].shape == (sym("batch"), sym("seq"), 32)
    assert str(model.input_specs["mask"]) == "float32[batch,seq]"
    assert "scaled_dot_product_attention" in program.graph.op_counts()  # composites kept in the template


def test_transformer_runs_at_five_shapes_like_eager(transformer: tuple[nn.Module, str]) -> None:
    torch_model, path = transformer
    model = edgerun.load(path)
    shapes = [(1, 2), (2, 8), (3, 17), (6, 48), (4, 31)]
    for i, (b, t) in enumerate(shapes):
        x, mask = _transformer_inputs(b, t, seed=i + 1)
        ours = model(x=x.numpy(), mask=mask.numpy()) if i % 2 else model(x.numpy(), mask.numpy())
        for o, r in zip(ours, torch_model(x, mask)):
            _close(o, r)
    assert model.cached_bindings[-1] == {"batch": 4, "seq": 31}
    assert model.specializations_made == 5
    model(*(t.numpy() for t in _transformer_inputs(2, 8, seed=9)))
    assert model.specializations_made == 5  # a shape seen before is not specialised again


def test_cnn_runs_at_five_shapes_like_eager(cnn: tuple[nn.Module, Program]) -> None:
    torch_model, program = cnn
    model = edgerun.load(program)
    for i, shape in enumerate([(1, 3, 16, 16), (2, 3, 40, 40), (3, 3, 33, 71), (6, 3, 96, 96), (1, 3, 96, 17)]):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(i))
        _close(model(x.numpy()), torch_model(x))


def test_auto_backends_place_each_specialisation(transformer: tuple[nn.Module, str]) -> None:
    torch_model, path = transformer
    model = edgerun.load(path, backends="auto")
    x, mask = _transformer_inputs(2, 5, seed=3)
    for o, r in zip(model(x.numpy(), mask.numpy()), torch_model(x, mask)):
        _close(o, r)
    assert model.specialization(x=(2, 5, 32), mask=(2, 5)).search is not None


def test_out_of_bounds_and_inconsistent_calls_name_input_dimension_and_symbol(
        transformer: tuple[nn.Module, str]) -> None:
    _, path = transformer
    model = edgerun.load(path)
    x, mask = _transformer_inputs(2, 8, seed=0)
    with pytest.raises(ShapeBindingError, match=r"input 'x' dimension 1 is 49: symbol 'seq' must be within \[2, 48\]"):
        model(np.zeros((2, 49, 32), np.float32), np.ones((2, 49), np.float32))
    with pytest.raises(ShapeBindingError, match=r"input 'x' dimension 0 is 7: symbol 'batch' must be within \[1, 6\]"):
        model(np.zeros((7, 8, 32), np.float32), np.ones((7, 8), np.float32))
    with pytest.raises(ShapeBindingError, match=r"input 'mask' dimension 1 is 9, but symbol 'seq' is already 8 "
                                                r"from input 'x' dimension 1"):
        model(x.numpy(), np.ones((2, 9), np.float32))
    with pytest.raises(ShapeBindingError, match=r"input 'x' dimension 2 is 16, the program needs 32"):
        model(np.zeros((2, 8, 16), np.float32), mask.numpy())
    with pytest.raises(ShapeBindingError, match=r"input 'mask' has rank 3"):
        model(x.numpy(), np.ones((2, 8, 1), np.float32))
    assert model.specializations_made == 0  # refused before any specialisation work


def test_specialised_arena_at_the_largest_shape_is_near_the_lower_bound(
        transformer: tuple[nn.Module, str], cnn: tuple[nn.Module, Program]) -> None:
    """Planning per concrete shape keeps the arena exact: within 1.15x of the live-bytes lower bound."""
    block = edgerun.load(transformer[1]).specialization(x=(6, 48, 32), mask=(6, 48))
    image = edgerun.load(cnn[1]).specialization(x=(6, 3, 96, 96))
    for loaded in (block, image):
        assert loaded.plan.lower_bound > 0
        assert loaded.plan.arena_bytes <= 1.15 * loaded.plan.lower_bound


def test_dimension_torch_specialises_is_reported_by_torch_export() -> None:
    class FixedSeq(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.view(x.shape[0], 4, 8)  # only seq == 32 fits: torch pins the Dim

    with pytest.raises(EdgerunError, match=r"(?s)Constraints violated \(seq\).*neither 0 nor 1"):
        edgerun.export(FixedSeq(), (torch.randn(2, 32),), dynamic_shapes=({1: Dim("seq", min=2, max=64)},))


def test_float_computed_from_a_symbolic_size_is_refused_clearly() -> None:
    class ScaledBySeq(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * x.shape[1] ** -0.5

    with pytest.raises(EdgerunError, match="float or boolean computed from symbolic sizes"):
        edgerun.export(ScaledBySeq(), (torch.randn(2, 8),), dynamic_shapes=({1: Dim("seq", min=2, max=64)},))


class Shifts(nn.Module):
    """Slices torch.export writes with open ends (slice(x, 1, 1, INT64_MAX)) and a TF-style INT32_MAX end,
    which must clamp to the symbolic length. (torch itself guards bounds that clamp only at some lengths.)"""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x[:, 1:] - x[:, :-1], x[:, 2:2147483647].sum(1), x[:, :2**31 - 1] * 2, x[:, 1:5]


def test_open_and_out_of_range_slice_ends_clamp_on_a_symbolic_axis() -> None:
    module = Shifts().eval()
    program = edgerun.export(module, (torch.randn(2, 9, 4),), dynamic_shapes={"x": {1: Dim("seq", min=5, max=48)}})
    seq = sym("seq")
    slices = [n for n in program.graph.nodes if n.op == "slice"]
    assert {program.graph.specs[n.outputs[0]].shape[1] for n in slices} == {seq - 1, seq - 2, 4}
    model = edgerun.load(program)
    for t in (5, 6, 9, 30, 48):
        x = torch.randn(2, t, 4)
        got = model(x.numpy())
        want = module(x)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.shape == tuple(w.shape)
            np.testing.assert_allclose(g, w.detach().numpy(), rtol=1e-6, atol=1e-6)
