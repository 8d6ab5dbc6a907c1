"""Every zoo model exports, verifies, decomposes, runs on the reference interpreter and matches torch eager;
its optimised program survives save -> edgerun.load -> run.

Relative error is max|ours - torch| / max(max|torch|, tiny) per output (see tests/zoo/zoo_checks.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import edgerun
from edgerun import zoo
from edgerun.frontends.torch import export_graph
from edgerun.ir.verifier import verify
from edgerun.oracle import interpret
from edgerun.passes.decompose_pass import DecomposePass
from edgerun.passes.pipeline import optimize
from edgerun.program.program import Program

sys.path.insert(0, str(Path(__file__).parent))
from zoo_checks import relative_error

MODELS = zoo.list_models()


def test_zoo_lists_every_family() -> None:
    assert {"mlp", "mobilenet_v2", "resnet18", "resnet50", "squeezenet1_1", "shufflenet_v2", "vit_tiny", "din",
            "llama_small", "minilm_l6"} <= set(MODELS)
    for name in MODELS:
        model = zoo.get(name)
        assert model.name == name and model.description and model.tolerance > 0


def test_unknown_model_names_the_known_ones() -> None:
    with pytest.raises(edgerun.EdgerunError, match="resnet18"):
        zoo.get("resnet19")


@pytest.mark.parametrize("name", MODELS)
def test_zoo_model_matches_eager_and_round_trips(name: str, tmp_path: Path) -> None:
    spec = zoo.get(name)
    module = spec.build()
    args = spec.example_inputs()
    assert not module.training
    with torch.no_grad():
        expected = module(*args)
    expected_list = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    want = [t.numpy() for t in expected_list]
    arrays = [a.numpy() for a in args]

    graph = export_graph(module, args)
    verify(graph)
    lowered = DecomposePass().call(graph.copy()).graph
    verify(lowered, allow_composite=False)
    got = interpret(lowered, arrays, decompose=False)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        assert relative_error(g, w) <= spec.tolerance, f"{name}: relative error {relative_error(g, w):.3g}"

    optimized, _ = optimize(graph)
    path = tmp_path / f"{name}.edgerun"
    Program(optimized).save(path)
    loaded = edgerun.load(path)
    outs = loaded.run(arrays)
    for g, w in zip(outs, want):
        assert relative_error(g, w) <= spec.tolerance, f"{name} after load: {relative_error(g, w):.3g}"


def test_batchnorm_statistics_are_calibrated() -> None:
    module = zoo.get("resnet18").build()
    bn = next(m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d))
    assert not np.allclose(bn.running_mean.numpy(), 0) and not np.allclose(bn.running_var.numpy(), 1)


def test_builds_are_deterministic() -> None:
    a, b = zoo.get("llama_small").build(), zoo.get("llama_small").build()
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
