"""edgerun.quantize on a program with state and two methods (a prefill/decode pair sharing weights and a
cache): the weights-only schemes quantize every method's layers, the state stays float and keeps flowing
between calls, the shared weights stay stored once, and the calibrated scheme is refused clearly."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_decoder import TinyDecoder
from torch import nn

import edgerun
from edgerun.errors import EdgerunError
from edgerun.program import Program
from edgerun.quantization import quantize_with_report

LAYER_OPS = {"int4-weight": {"matmul_int4"}, "int8-dynamic": {"dynamic_quantize", "matmul_integer"},
             "8da4w": {"dynamic_quantize", "matmul_int4"}}
MIN_DB = {"int4-weight": 15, "int8-dynamic": 30, "8da4w": 15}


def sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum((ref - got.astype(np.float64)) ** 2)))


@pytest.fixture(scope="module")
def decoder() -> tuple[nn.Module, Program]:
    torch.manual_seed(0)
    module = TinyDecoder()
    program = edgerun.export_methods(module, {
        "prefill": ("prefill", (torch.randn(4, 128),)),
        "decode": (module.decode, (torch.randn(1, 128), torch.tensor(4))),
    })
    return module, program


@pytest.mark.parametrize("scheme", ["int4-weight", "int8-dynamic", "8da4w"])
def test_weights_only_schemes_quantize_every_method_and_keep_the_state_float(decoder, scheme, tmp_path: Path):
    module, program = decoder
    quantized, report = quantize_with_report(program, scheme)
    assert list(quantized.methods) == ["prefill", "decode"] and quantized.default_method == "prefill"
    for name, graph in quantized.methods.items():
        ops = {n.op for n in graph.nodes}
        assert LAYER_OPS[scheme] <= ops and "linear" not in ops, name
        assert graph.state_updates.keys() == {"cache"}, name
    assert quantized.state["cache"].dtype == np.float32 and not quantized.state["cache"].any()
    assert quantized.metadata["quantization"]["scheme"] == scheme and report.skipped == []
    path = tmp_path / "q.edgerun"
    quantized.save(path)
    model = edgerun.load(path)
    eager = copy.deepcopy(module)
    torch.manual_seed(3)
    prompt = torch.randn(4, 128)
    got, want = [model(prompt.numpy())], [eager.prefill(prompt).detach().numpy()]
    for pos in (4, 5, 6):  # each decode reads the cache that prefill and the decodes before it wrote
        x = torch.randn(1, 128)
        got.append(model.decode(x.numpy(), np.array(pos)))
        want.append(eager.decode(x, torch.tensor(pos)).detach().numpy())
    for g, w in zip(got, want):
        assert g.shape == w.shape and sqnr(w, g) > MIN_DB[scheme]
    assert sqnr(eager.cache.detach().numpy(), model.state["cache"]) > MIN_DB[scheme]
    model.reset_state()
    assert not model.state["cache"].any()


def test_shared_weights_stay_stored_once(decoder, tmp_path: Path) -> None:
    """Both methods use both layers: the two-method int4 file is no bigger than a one-method program with
    the same int4 weights, plus a graph."""
    module, program = decoder
    alone = edgerun.export_methods(module, {"prefill": ("prefill", (torch.randn(4, 128),))})
    quantize_with_report(alone, "int4-weight")[0].save(tmp_path / "one.edgerun")
    quantize_with_report(program, "int4-weight")[0].save(tmp_path / "two.edgerun")
    program.save(tmp_path / "float.edgerun")
    one, two = (tmp_path / "one.edgerun").stat().st_size, (tmp_path / "two.edgerun").stat().st_size
    int4_weights = 2 * 128 * 128 // 2
    assert two < one + 8 * 1024 < one + int4_weights
    assert two < 0.35 * (tmp_path / "float.edgerun").stat().st_size


def test_calibrated_scheme_calibration_and_unknown_excludes_are_refused_clearly(decoder) -> None:
    _, program = decoder
    with pytest.raises(EdgerunError, match=r"scheme 'int8-static' calibrates activations.*program with state.*"
                                           r"int8-dynamic, int4-weight, 8da4w"):
        quantize_with_report(program, "int8-static")
    with pytest.raises(EdgerunError, match="calibration= is not taken for a program with state"):
        quantize_with_report(program, "int8-dynamic", calibration={"x": np.zeros((4, 128), np.float32)})
    with pytest.raises(EdgerunError, match=r"--exclude \['nope'\]: no layer or op type of that name in any method"):
        quantize_with_report(program, "int4-weight", exclude=["nope"])


def test_exclude_by_module_and_by_a_layer_only_one_method_has(decoder) -> None:
    _, program = decoder
    quantized, report = quantize_with_report(program, "int4-weight", exclude=["inner.head"])  # the wrapped module
    for graph in quantized.methods.values():  # head stays float in both methods, embed is int4 in both
        ops = [n.op for n in graph.nodes]
        assert ops.count("matmul_int4") == 1 and len(report.skipped) == 2
    # a layer name that only decode has (its node there) is accepted, and leaves prefill's layers alone
    prefill_names = {layer.node.name for layer in _layers(program, "prefill")}
    only_decode = sorted(layer.node.name for layer in _layers(program, "decode") if layer.node.name not in prefill_names)
    assert only_decode
    quantized, _ = quantize_with_report(program, "int4-weight", exclude=only_decode[:1])
    counts = {m: [n.op for n in g.nodes].count("matmul_int4") for m, g in quantized.methods.items()}
    assert counts == {"prefill": 2, "decode": 1}


def _layers(program: Program, method: str) -> list:
    """The int4 scheme's candidate layers of a method, as quantize finds them (functional, optimised)."""
    from edgerun.ir.state import to_functional
    from edgerun.passes.pipeline import optimize
    from edgerun.quantization.rewrite import find_layers

    return find_layers(optimize(to_functional(program.methods[method])[0])[0], ("matmul",))
