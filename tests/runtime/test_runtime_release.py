"""The last step of the backend contract (compile, run, release): `RunnableProgram.release` calls every
partition's `release`, frees the arena, and the program refuses to run after it."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence

import numpy as np
import pytest
from runtime_testkit import InterpreterBackend, chain_of_adds, random_inputs, small_cnn

from edgerun.backends.base import CompiledPartition
from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph
from edgerun.oracle import interpret
from edgerun.program import Program
from edgerun.runtime import load


class ReleasingBackend(InterpreterBackend):
    """The interpreter, whose partitions record their release."""

    def __init__(self, ops: Sequence[str]) -> None:
        super().__init__("releasing", ops)
        self.released: list[int] = []

    def compile(self, subgraph: Graph) -> CompiledPartition:
        compiled = super().compile(subgraph)
        index = self.compiled
        compiled.release = lambda: self.released.append(index)
        return compiled


def test_release_calls_every_partitions_release_once_and_the_program_then_refuses_to_run() -> None:
    graph = chain_of_adds(6)
    backend = ReleasingBackend(["add"])
    loaded = load(graph, [backend])
    x = random_inputs(graph)
    np.testing.assert_allclose(loaded.run(x)[0], interpret(graph, x)[0], rtol=1e-6)
    assert backend.compiled >= 1 and backend.released == []
    loaded.release()
    assert sorted(backend.released) == list(range(1, backend.compiled + 1))
    assert loaded.parts.arena.nbytes == 0 and loaded.instructions == []  # type: ignore[attr-defined]
    with pytest.raises(EdgerunError, match="released"):
        loaded.run(x)
    with pytest.raises(EdgerunError, match="released"):
        loaded(*x)


def test_a_released_onnxruntime_partition_frees_its_session() -> None:
    pytest.importorskip("onnxruntime")
    from edgerun.backends.onnxruntime.onnx_prepacked import _HANDED_OVER

    graph = small_cnn()
    loaded = load(Program(graph), ["onnxruntime"])
    x = random_inputs(graph)
    want = loaded.run(x)[0]
    runners = [cp.run.__self__ for cp in loaded.parts.compiled if cp.backend == "onnxruntime"]  # type: ignore[attr-defined]
    sessions = [weakref.ref(r.session) for r in runners]
    assert sessions and all(s() in _HANDED_OVER for s in sessions)
    np.testing.assert_allclose(want, interpret(graph, x)[0], rtol=1e-4, atol=1e-5)
    loaded.release()
    gc.collect()
    assert all(r.session is None and r.closed for r in runners)
    assert all(s() is None for s in sessions)  # freed, with the OrtValues handed over beside them
    with pytest.raises(EdgerunError, match="released"):
        runners[0].run(x, [np.empty_like(want)])
