"""A delegate partition that updates a state in place: `CompiledPartition.overwrites_inputs` names the outputs
it computes over an input's own array, and the runtime then plans the state's update into the state's buffer
(no copy after the call), as it does for the reference's update_slice."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

import edgerun
from edgerun.backends.base import Backend, CompiledPartition, OpSupport
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program

CACHE = TensorSpec((6, 2), DType.float32)


class RowWriter(Backend):
    """A delegate running one `update_slice` per partition in numpy: when its output is its input's array it
    writes only the new rows (a KV-cache append), so it declares that output as overwriting that input."""

    name = "rowwriter"
    supported = {"update_slice": OpSupport(dtypes=frozenset({DType.float32, DType.int64}))}

    def __init__(self, declares: bool) -> None:
        self.declares = declares
        self.shared_buffers: list[bool] = []  # per call: did the runtime hand the input's array as the output?

    def compile(self, subgraph: Graph) -> CompiledPartition:
        (node,) = subgraph.nodes
        order = [subgraph.inputs.index(v) for v in node.inputs]

        def run(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
            cache, rows, start = (inputs[k] for k in order)
            out = outputs[0]
            self.shared_buffers.append(out is cache or np.shares_memory(out, cache))
            if not self.shared_buffers[-1]:
                out[...] = cache
            first = int(start.reshape(-1)[0])
            out[first:first + rows.shape[0]] = rows

        overwrites = {node.outputs[0]: node.inputs[0]} if self.declares else {}
        return CompiledPartition(self.name, subgraph, run, overwrites_inputs=overwrites)


def appending_program() -> Program:
    """cache' = update_slice(cache, 2 * rows, start); returns the cache's sum before the write."""
    g = Graph()
    b = Builder(g)
    rows = g.add_input("rows", TensorSpec((2, 2), DType.float32))
    start = g.add_input("start", TensorSpec((1,), DType.int64))
    g.specs["cache"] = CACHE
    g.state_inputs.append("cache")
    g.outputs = [b.emit("reduce_sum", ["cache"], axes=[0, 1])]
    doubled = b.binary("mul", rows, b.const(np.float32(2.0)))
    g.state_updates["cache"] = b.emit("update_slice", ["cache", doubled, start], axis=0)
    return Program(g, state={"cache": np.zeros(CACHE.shape, np.float32)})


def run_appends(backend: RowWriter) -> edgerun.LoadedProgram:
    model = edgerun.load(appending_program(), backends=[backend, "reference"])
    expected = np.zeros(CACHE.shape, np.float32)
    for k in range(3):
        rows = np.full((2, 2), k + 1, np.float32)
        np.testing.assert_allclose(model(rows, np.array([2 * k], np.int64)), expected.sum(), rtol=1e-6)
        expected[2 * k:2 * k + 2] = 2 * rows
        np.testing.assert_array_equal(model.state["cache"], expected)
    return model


def test_a_declared_overwrite_plans_the_delegates_update_into_the_state_buffer():
    backend = RowWriter(declares=True)
    model = run_appends(backend)
    assert [p.backend for p in model.parts.partitions] == ["reference", "rowwriter"]
    assert model.parts.state is not None
    assert model.parts.state.plan.in_place == ("cache",) and model.parts.state.plan.copies == ()
    assert backend.shared_buffers == [True, True, True]


def test_without_the_declaration_the_update_is_copied_after_the_call():
    backend = RowWriter(declares=False)
    model = run_appends(backend)
    assert model.parts.state is not None
    assert model.parts.state.plan.in_place == () and [s for s, _ in model.parts.state.plan.copies] == ["cache"]
    assert backend.shared_buffers == [False, False, False]
