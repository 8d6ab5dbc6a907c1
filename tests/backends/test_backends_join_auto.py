"""A backend joins `backends="auto"` by declaring itself in its own module: this module is such a backend
(a toy whose every node is one numpy ufunc), registered with joins_auto=True, and nothing else is edited."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from edgerun.backends import registry
from edgerun.backends.base import Backend, CompiledPartition, OpSupport, Throughput
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.search import CACHE_ENV, auto_backends, load, plan_auto

UFUNCS = {"tanh": np.tanh, "exp": np.exp}


class ToyBackend(Backend):
    """Runs a partition of unary float32 ufuncs as one call; declares itself far faster than the reference."""

    name = "toy"
    supported: ClassVar = {op: OpSupport(dtypes=frozenset({DType.float32})) for op in UFUNCS}
    throughput = Throughput(flops_per_s=1e15, bytes_per_s=1e15, dispatch_s=1e-9)
    compiled: ClassVar[list[int]] = []  # node count of every partition compiled, by any instance

    def compile(self, subgraph: Graph) -> CompiledPartition:
        self.compiled.append(len(subgraph.nodes))
        steps = [(UFUNCS[n.op], n.inputs[0], n.outputs[0]) for n in subgraph.nodes]

        def run(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
            values = dict(zip(subgraph.inputs, inputs))
            for ufunc, x, y in steps:
                values[y] = ufunc(values[x])
            for name, out in zip(subgraph.outputs, outputs):
                out[...] = values[name]

        return CompiledPartition(self.name, subgraph, run)


@pytest.fixture
def toy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    registry.register_backend("toy", ToyBackend, joins_auto=True)
    yield
    registry.unregister_backend("toy")


def tanh_chain(nodes: int = 12) -> Graph:
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", TensorSpec((4, 64), DType.float32))
    for _ in range(nodes):
        v = b.emit("tanh", [v])
    g.outputs = [v]
    return g


def test_a_declared_backend_is_an_auto_candidate_and_auto_places_on_it(
        toy: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert "toy" in registry.auto_candidates() and registry.auto_candidates()[-1] == "reference"
    # The other shipped engines left out of this process's auto, so that nothing but the toy's declaration
    # and the reference's calibration decide (and no engine is calibrated for the test).
    monkeypatch.setattr(registry, "SHIPPED", {"reference": True})
    assert [b.name for b in auto_backends()] == ["toy", "reference"]
    g = tanh_chain()
    plan = plan_auto(g)  # the model alone: the toy declares itself far faster
    assert set(plan.placement.values()) == {"toy"}
    ToyBackend.compiled.clear()
    loaded = load(g, backends="auto")  # the first auto load measures it against the reference alone
    measured = {c["label"] for c in loaded.search.tuning["candidates"] if c["measured_s"] is not None}
    assert "search" in measured and loaded.search.tuning["winner"] in ("search", "all reference")
    # One build of the toy's one partition: the candidate's, which is also the program returned if it won.
    assert ToyBackend.compiled == [len(g.nodes)]
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_allclose(loaded(x), interpret(g, [x])[0], rtol=1e-6)


def test_an_undeclared_backend_is_not_a_candidate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry.register_backend("quiet", ToyBackend)
    try:
        assert "quiet" not in registry.auto_candidates()
    finally:
        registry.unregister_backend("quiet")
