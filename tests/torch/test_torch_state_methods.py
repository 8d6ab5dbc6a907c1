"""torch: buffers mutated in forward become program state; several methods export into one program that
shares weights and state (a KV-cache-like buffer written by prefill and read by decode)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tiny_decoder import TinyDecoder
from torch import nn

import edgerun
from edgerun.errors import EdgerunError

BACKENDS = [None, "onnxruntime", "auto"]


class RunningStats(nn.Module):
    """A call counter, a running mean (in-place mul_/add_) and an RNN-like hidden state (copy_)."""

    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("hidden", torch.zeros(1, 4))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.count += 1
        self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        h = torch.tanh(self.cell(x[:1]) + self.hidden)
        self.hidden.copy_(h)
        return h * 2 + self.mean, self.count.float()


@pytest.fixture(scope="module")
def stats_path(tmp_path_factory):
    torch.manual_seed(0)
    module = RunningStats()
    path = tmp_path_factory.mktemp("state") / "stats.edgerun"
    edgerun.export(module, (torch.randn(3, 4),)).save(path)
    return module, path


@pytest.mark.parametrize("backends", BACKENDS)
def test_mutated_buffers_persist_like_eager_and_reset(stats_path, backends):
    module, path = stats_path
    program = edgerun.Program.read(path)
    assert sorted(program.state) == ["count", "hidden", "mean"]
    model = edgerun.load(path, backends=backends)
    for _ in range(2):  # the second round after reset_state starts from the initial values again
        eager = copy.deepcopy(module)
        torch.manual_seed(1)
        for _ in range(4):
            x = torch.randn(3, 4)
            want_y, want_count = eager(x)
            got_y, got_count = model(x.numpy())
            np.testing.assert_allclose(got_y, want_y.detach().numpy(), rtol=1e-5, atol=1e-6)
            assert got_count == want_count.item()
        np.testing.assert_allclose(model.state["hidden"], eager.hidden.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(model.state["mean"], eager.mean.detach().numpy(), rtol=1e-5, atol=1e-6)
        assert model.state["count"] == 4
        model.reset_state()
        assert model.state["count"] == 0 and not model.state["hidden"].any()


@pytest.fixture(scope="module")
def decoder_path(tmp_path_factory):
    torch.manual_seed(0)
    module = TinyDecoder()
    program = edgerun.export_methods(module, {
        "prefill": ("prefill", (torch.randn(4, 128),)),
        "decode": (module.decode, (torch.randn(1, 128), torch.tensor(4))),
    })
    path = tmp_path_factory.mktemp("methods") / "decoder.edgerun"
    program.save(path)
    return module, program, path


def test_two_methods_store_their_weights_once(decoder_path):
    module, program, path = decoder_path
    assert list(program.methods) == ["prefill", "decode"] and program.default_method == "prefill"
    weight_bytes = sum(p.numel() * 4 for p in module.parameters())
    cache_bytes = module.cache.numel() * 4
    # both methods use every weight; one copy of them, the cache's initial value and two small graphs
    assert path.stat().st_size < weight_bytes + cache_bytes + 24 * 1024
    assert path.stat().st_size < 1.2 * (weight_bytes + cache_bytes)


@pytest.mark.parametrize("backends", BACKENDS)
def test_state_flows_from_prefill_to_decode_like_eager(decoder_path, backends):
    module, _, path = decoder_path
    model = edgerun.load(path, backends=backends)
    assert model.methods == ["prefill", "decode"]
    eager = copy.deepcopy(module)
    torch.manual_seed(2)
    prompt = torch.randn(4, 128)
    np.testing.assert_allclose(model(prompt.numpy()), eager.prefill(prompt).detach().numpy(), rtol=1e-4,
                               atol=1e-5)
    if backends is None:  # prefill's raster writes only the prompt's rows, straight into the cache
        assert model.parts.state is not None and model.parts.state.plan.in_place == ("cache",)
    for pos in (4, 5, 6):
        x = torch.randn(1, 128)
        got = model.decode(x.numpy(), np.array(pos))
        np.testing.assert_allclose(got, eager.decode(x, torch.tensor(pos)).detach().numpy(), rtol=1e-4,
                                   atol=1e-5)
    np.testing.assert_allclose(model.state["cache"], eager.cache.detach().numpy(), rtol=1e-4, atol=1e-5)
    model.reset_state()
    assert not model.state["cache"].any()


def test_export_methods_errors_name_the_method():
    module = TinyDecoder()
    with pytest.raises(EdgerunError, match=r"method 'step'.*no method 'nope'"):
        edgerun.export_methods(module, {"step": ("nope", (torch.randn(1, 128),))})
    with pytest.raises(EdgerunError, match="default_method 'forward'"):
        edgerun.export_methods(module, {"prefill": ("prefill", (torch.randn(4, 128),))},
                               default_method="forward")


class Accumulator(nn.Module):
    """forward takes any sequence length (a template method) and adds into a static-shaped state that the
    static method `read` reads."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        self.total += y.sum(0)
        return y

    def read(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + self.total


@pytest.mark.parametrize("backends", BACKENDS)
def test_a_dynamic_length_method_shares_state_with_a_static_one(tmp_path, backends):
    torch.manual_seed(0)
    module = Accumulator()
    seq = torch.export.Dim("seq", min=1, max=16)
    program = edgerun.export_methods(module, {
        "forward": ("forward", (torch.randn(3, 4),), None, {"x": {0: seq}}),
        "read": ("read", (torch.randn(1, 4),)),
    })
    assert program.graph.symbols == {"seq": (1, 16)} and not program.methods["read"].symbols
    program.save(tmp_path / "acc.edgerun")
    model = edgerun.load(tmp_path / "acc.edgerun", backends=backends)
    eager = copy.deepcopy(module)
    for n in (2, 5, 7, 2):  # three specialisations, one state (the auto search's timing runs leave it alone)
        x = torch.randn(n, 4)
        np.testing.assert_allclose(model(x.numpy()), eager(x).detach().numpy(), rtol=1e-5, atol=1e-5)
    q = torch.randn(1, 4)
    np.testing.assert_allclose(model.read(q.numpy()), eager.read(q).detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.state["total"], eager.total.detach().numpy(), rtol=1e-5, atol=1e-5)
    model.reset_state()
    assert not model.state["total"].any()


class Overwrite(nn.Module):
    """A state set from an input, one set to a constant, and the old value returned."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("h", torch.zeros(2, 3))
        self.register_buffer("k", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        old = self.h.clone()
        self.h.copy_(x)
        self.k.fill_(5.0)
        return old * 2


@pytest.mark.parametrize("backends", BACKENDS)
def test_updates_from_an_input_and_a_constant_and_the_old_value_as_output(backends):
    model = edgerun.load(edgerun.export(Overwrite(), (torch.randn(2, 3),)), backends=backends)
    ones = np.ones((2, 3), np.float32)
    assert not model(ones).any()  # the old (initial) value, not the one this call writes
    np.testing.assert_array_equal(model(3 * ones), 2 * ones)
    np.testing.assert_array_equal(model.state["h"], 3 * ones)
    np.testing.assert_array_equal(model.state["k"], np.full(3, 5, np.float32))


class PromptCache(nn.Module):
    """An LLM's shape: prefill of any length writes the first rows of a fixed-size cache, decode writes the
    row at a run-time position and reads the whole cache."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 16)
        self.register_buffer("cache", torch.zeros(8, 16))

    def prefill(self, x: torch.Tensor) -> torch.Tensor:
        k = self.embed(x)
        self.cache[: x.shape[0]] = k
        return k.sum(0, keepdim=True)

    def decode(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        k = self.embed(x)
        row = (torch.arange(8) == pos).unsqueeze(1)
        self.cache.copy_(torch.where(row, k, self.cache))
        return (self.cache @ k.T).T


@pytest.mark.parametrize("backends", BACKENDS)
def test_a_prompt_of_any_length_fills_the_cache_that_decode_reads(backends):
    torch.manual_seed(0)
    module = PromptCache()
    program = edgerun.export_methods(module, {
        "prefill": ("prefill", (torch.randn(3, 16),), None, {"x": {0: torch.export.Dim("seq", min=1, max=8)}}),
        "decode": ("decode", (torch.randn(1, 16), torch.tensor(3))),
    })
    model = edgerun.load(program, backends=backends)
    for n in (3, 8, 5):
        eager = copy.deepcopy(module)
        model.reset_state()
        prompt = torch.randn(n, 16)
        np.testing.assert_allclose(model(prompt.numpy()), eager.prefill(prompt).detach().numpy(), rtol=1e-5,
                                   atol=1e-5)
        if backends is None:  # the prompt's rows only, written straight into the cache
            assert model.specialization(x=(n, 16)).parts.state.plan.in_place == ("cache",)
        if n < 8:
            token = torch.randn(1, 16)
            np.testing.assert_allclose(model.decode(token.numpy(), np.array(n)),
                                       eager.decode(token, torch.tensor(n)).detach().numpy(), rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(model.state["cache"], eager.cache.detach().numpy(), rtol=1e-5, atol=1e-5)


class DecodeAtPosition(nn.Module):
    """decode writes the row at a run-time position with index_copy_ (update_slice) and reads the cache."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(16, 16)
        self.register_buffer("cache", torch.zeros(8, 16))

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        k = self.embed(x)
        self.cache.index_copy_(0, pos, k)
        return (self.cache @ k.T).T


@pytest.mark.parametrize("backends", BACKENDS)
def test_a_row_written_at_a_run_time_position_is_written_in_place(backends):
    torch.manual_seed(0)
    module = DecodeAtPosition()
    model = edgerun.load(edgerun.export(module, (torch.randn(1, 16), torch.tensor([3]))), backends=backends)
    assert any(i.op == "update_slice" for i in model.instructions)
    assert model.parts.state is not None and model.parts.state.plan.in_place == ("cache",)
    eager = copy.deepcopy(module)
    for pos in (0, 3, 7, 1):
        x = torch.randn(1, 16)
        np.testing.assert_allclose(model(x.numpy(), np.array([pos])), eager(x, torch.tensor([pos])).detach().numpy(),
                                   rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(model.state["cache"], eager.cache.detach().numpy(), rtol=1e-5, atol=1e-5)
