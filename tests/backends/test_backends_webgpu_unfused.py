"""The webgpu arena plan keeps a shared range alive for every name a dispatch binds it by.

An identity raster's output shares its source's device range (and an in-place KV append's output its
cache's). The fused lowering binds such values by their source's name; the unfused one binds each value by
its own. Lowering the LLM step unfused under the fused plan's aliases (a diagnosis, patching the
runner's `lower`) gave NaN when the plan timed the source's bytes by the source's own readers only, handed
them to a later value, and the raster's reader then read that value. The plan now times every range by all
the names bound to it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("wgpu")

from edgerun.errors import BackendUnavailableError
from edgerun.ir.builder import Builder
from edgerun.ir.decompose import decomposed
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret

try:
    from edgerun.backends.webgpu import WebGpuBackend, get_device
    from edgerun.backends.webgpu import runner as runner_module
    from edgerun.backends.webgpu.lowering import lower

    get_device()
except BackendUnavailableError as exc:  # pragma: no cover - CI installs lavapipe
    pytest.skip(f"no WebGPU adapter: {exc}", allow_module_level=True)


def _reshape_read_after_its_source() -> tuple[Graph, list[np.ndarray]]:
    # r = reshape(exp(x)) is read by the last node only; neg(x) is made after exp's last direct reader (the
    # raster), so a plan that times exp's bytes by that reader gives them to neg's output.
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((4, 6), DType.float32))
    r = b.emit("reshape", [b.unary("exp", x)], shape=[24])
    g.outputs = [b.binary("add", r, b.emit("reshape", [b.unary("neg", x)], shape=[24]))]
    return decomposed(g), [np.random.default_rng(0).uniform(-2, 2, (4, 6)).astype(np.float32)]


def test_a_range_shared_by_an_alias_lives_until_the_alias_is_last_read(monkeypatch: Any) -> None:
    # The fused plan's aliases over the unfused lowering's dispatches (each value bound by its own name).
    monkeypatch.setattr(runner_module, "lower", lambda graph, fuse, *a, **k: lower(graph, False, *a, **k))
    graph, feeds = _reshape_read_after_its_source()
    compiled = WebGpuBackend(fuse=True).compile(graph)
    runner = compiled.info["runner"]
    bound_by_alias = [v for k in runner.kernels for v in k.values if v in runner.alias]
    assert bound_by_alias  # the case under test: a dispatch reads a shared range by the alias's name
    for v in bound_by_alias:
        assert runner.value_range(v) == runner.value_range(runner.alias[v])
    want = interpret(graph, feeds)
    np.testing.assert_allclose(compiled(*feeds)[0], want[0], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("fuse", [False, True])
def test_the_lowering_binds_shared_ranges_by_their_source(fuse: bool) -> None:
    # What the backend does as loaded, either way: no dispatch names an alias, and the result is the oracle's.
    graph, feeds = _reshape_read_after_its_source()
    compiled = WebGpuBackend(fuse=fuse).compile(graph)
    runner = compiled.info["runner"]
    assert bool(runner.alias) == fuse
    assert not [v for k in runner.kernels for v in k.values if v in runner.alias]
    np.testing.assert_allclose(compiled(*feeds)[0], interpret(graph, feeds)[0], rtol=1e-6, atol=1e-6)
