"""Hybrid placements on zoo models: all reference, all ONNX Runtime, alternating node by node, and the
search's own choice all match the reference within tolerance.

Six models cover the families (MLP, recommendation, CNN with depthwise convs, CNN with residuals, ViT, LLM)
inside the test budget; `bench/search_time.py` runs the same four patterns on every zoo model.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

from backends_testkit import relative_error

from edgerun import zoo
from edgerun.frontends.torch import export
from edgerun.search import CACHE_ENV, load

MODELS = ["mlp", "din", "llama_small", "vit_tiny", "resnet18", "mobilenet_v2"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("edgerun-cache")


def _optimized(name: str) -> tuple[object, list[np.ndarray], float]:
    model = zoo.get(name)
    graph = export(model.build(), model.example_inputs()).graph
    try:
        from edgerun.passes import optimize
        graph, _ = optimize(graph)
    except ImportError:
        pass
    return graph, [a.numpy() for a in model.example_inputs()], max(model.tolerance, 1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_every_partition_pattern_matches_reference(name: str, cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(cache))
    graph, args, tolerance = _optimized(name)
    reference = load(graph)
    want = reference.run(args)
    nodes = [n.name for n in reference.graph.nodes]
    patterns = {
        "all onnxruntime": {"backends": ["onnxruntime"]},
        "alternating": {"placement": {n: ("onnxruntime" if k % 2 else "reference") for k, n in enumerate(nodes)}},
        "auto": {"backends": "auto"},
    }
    for label, kwargs in patterns.items():
        with warnings.catch_warnings():
            # Alternating asks ORT for nodes it does not claim; the runtime warns and keeps them on reference.
            warnings.simplefilter("ignore", RuntimeWarning)
            loaded = load(graph, **kwargs)  # type: ignore[arg-type]
        used = {p.backend for p in loaded.partitions}
        if label != "auto":
            assert "onnxruntime" in used, label
        if label == "alternating":
            assert len(loaded.partitions) > 2
        for got, ref in zip(loaded.run(args), want):
            assert got.shape == ref.shape and got.dtype == ref.dtype
            assert relative_error(got, ref) <= tolerance, (label, relative_error(got, ref))
