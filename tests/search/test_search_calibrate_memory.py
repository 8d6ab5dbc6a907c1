"""Calibration's memory rate: a delegate's copies at its boundary are a transfer cost, not op bandwidth; and a
model MNN runs every op of is a single-engine candidate of its own."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgerun.search.calibrate import ADD_CHAIN_EXTRA, _memory_rates

ADD_BYTES = 3.0 * 4 * (1 << 20)


def test_a_delegates_boundary_copies_become_its_transfer_rate() -> None:
    # MNN-like: the one-add call is mostly copies in and out; each extra add of the chain costs little.
    per_add, boundary = 0.2e-3, 1.4e-3
    rate, transfer = _memory_rates(per_add + boundary, per_add * (1 + ADD_CHAIN_EXTRA) + boundary, ADD_BYTES,
                                   math.inf)
    assert rate == pytest.approx(ADD_BYTES / per_add)
    assert transfer == pytest.approx(ADD_BYTES / boundary)


def test_a_backend_on_host_memory_keeps_its_declared_transfer() -> None:
    per_add = 0.3e-3  # the one-add call is the add: nothing to charge at the boundary
    rate, transfer = _memory_rates(per_add * 1.1, per_add * (1.1 + ADD_CHAIN_EXTRA), ADD_BYTES, math.inf)
    assert rate == pytest.approx(ADD_BYTES / per_add)
    assert transfer == math.inf
    # A chain measured no slower than one add (noise) falls back to the one-add figure.
    assert _memory_rates(1e-3, 0.9e-3, ADD_BYTES, 7e9) == (pytest.approx(ADD_BYTES / 1e-3), 7e9)


def test_a_backend_on_the_arenas_arrays_is_not_charged_for_a_cache_effect() -> None:
    # ONNX Runtime-like: the chain's later adds run from cache, so the one-add call looks like a boundary. A
    # backend that runs on the arena's own arrays has none: it keeps the one-add rate and its declared transfer.
    one, chain = 1.0e-3, 1.0e-3 + 0.2e-3 * ADD_CHAIN_EXTRA
    assert _memory_rates(one, chain, ADD_BYTES, math.inf, copies_at_boundary=False) == (
        pytest.approx(ADD_BYTES / one), math.inf)
    # The same timings on a backend that copies at its boundary are split into op rate and transfer rate.
    rate, transfer = _memory_rates(one, chain, ADD_BYTES, math.inf, copies_at_boundary=True)
    assert rate == pytest.approx(ADD_BYTES / 0.2e-3) and transfer == pytest.approx(ADD_BYTES / 0.8e-3)


def test_only_delegates_that_copy_at_their_boundary_are_split() -> None:
    # The declaration calibration reads: MNN copies in and out of tensors of its own, ONNX Runtime runs on
    # bound arena views and the reference on the arrays themselves.
    from edgerun.search import auto_backends

    copies = {b.name: b.copies_at_boundary for b in auto_backends()}
    assert copies.get("onnxruntime") is False and copies.get("reference") is False
    if "mnn" in copies:
        assert copies["mnn"] is True


@pytest.mark.parametrize("name", ["din", "mlp"])
def test_mnn_alone_is_a_one_engine_candidate_for_din_and_mlp(name: str) -> None:
    # DIN's int64 gathers, masks and feature concats and the MLP's GELU (as its pieces) are MNN's, so the
    # first-load tuning can measure "all mnn" as one MNN call (it used to mix in the reference).
    pytest.importorskip("MNN")
    pytest.importorskip("torch")
    from edgerun import zoo
    from edgerun.frontends.torch import export
    from edgerun.runtime.loader import prepare_graph
    from edgerun.search import auto_backends

    model = zoo.get(name)
    graph = prepare_graph(export(model.build(), model.example_inputs()).graph, auto_backends())
    mnn = next(b for b in auto_backends() if b.name == "mnn")
    assert all(mnn.supports(n, graph) for n in graph.nodes), [n.op for n in graph.nodes if not mnn.supports(n, graph)]
    assert np.isfinite([mnn.estimate_seconds(n, graph) for n in graph.nodes]).all()
