"""Property tests: random chains of layout ops give bit-identical results after raster merging, never more nodes."""

from __future__ import annotations

import math
import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.ir.verifier import verify
from edgerun.oracle import interpret
from edgerun.passes.dead_code_pass import DeadCodePass
from edgerun.passes.decompose_pass import DecomposePass
from edgerun.passes.pipeline import optimize
from edgerun.passes.raster_merge_pass import RasterMergePass

_OPS = ("transpose", "reshape", "slice", "pad", "concat", "expand", "branch")


def _apply(draw: st.DrawFn, b: Builder, x: str, op: str) -> str:
    shape = b.shape(x)
    rank = len(shape)
    if op == "transpose":
        return b.emit("transpose", [x], perm=draw(st.permutations(range(rank))))
    if op == "reshape":
        numel = math.prod(shape)
        dims: list[int] = []
        rest = numel
        while rest > 1 and len(dims) < 3:
            divisors = [d for d in range(2, rest + 1) if rest % d == 0]
            d = draw(st.sampled_from(divisors))
            dims.append(d)
            rest //= d
        dims.append(rest)
        return b.emit("reshape", [x], shape=draw(st.permutations(dims)))
    if op == "slice":
        axis = draw(st.integers(0, rank - 1))
        n = shape[axis]
        step = draw(st.sampled_from([1, 1, 2, 3, -1, -2]))
        start = draw(st.integers(-n, n))
        end = draw(st.integers(-n - 1, n + 1))
        if len(range(*slice(start, end, step).indices(n))) == 0:
            start, end, step = 0, n, 1
        return b.emit("slice", [x], starts=[start], ends=[end], axes=[axis], steps=[step])
    if op == "pad":
        mode = draw(st.sampled_from(["constant", "constant", "reflect", "edge"]))
        pads = []
        for n in shape:
            limit = n - 1 if mode == "reflect" else 2
            pads.append([draw(st.integers(0, max(0, min(2, limit)))), draw(st.integers(0, max(0, min(2, limit))))])
        return b.emit("pad", [x], pads=pads, mode=mode, value=float(draw(st.sampled_from([0.0, -1.0, 2.5]))))
    if op == "concat":
        axis = draw(st.integers(0, rank - 1))
        other = x if draw(st.booleans()) else b.graph.add_input(b.graph.fresh_name("y"),
                                                                 TensorSpec(shape, DType.float32))
        return b.emit("concat", [x, other] if draw(st.booleans()) else [other, x], axis=axis)
    if op == "expand":
        axis = draw(st.integers(0, rank))
        unsqueezed = b.emit("reshape", [x], shape=[*shape[:axis], 1, *shape[axis:]])
        target = list(b.shape(unsqueezed))
        target[axis] = draw(st.integers(1, 3))
        return b.emit("expand", [unsqueezed], shape=target)
    # branch: two readers of the same raster, so the inner one must survive for the other
    left = b.emit("transpose", [x], perm=list(range(rank))[::-1])
    right = b.emit("slice", [x], starts=[0], ends=[max(1, shape[0] // 2)], axes=[0])
    return b.emit("concat", [b.emit("reshape", [left], shape=[-1]), b.emit("reshape", [right], shape=[-1])])


@st.composite
def layout_chains(draw: st.DrawFn) -> Graph:
    graph = Graph()
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    x = graph.add_input("x", TensorSpec(shape, DType.float32))
    b = Builder(graph)
    outputs = []
    for _ in range(draw(st.integers(1, 6))):
        x = _apply(draw, b, x, draw(st.sampled_from(_OPS)))
        if math.prod(b.shape(x)) > 4096:
            break
        if draw(st.integers(0, 5)) == 0:
            outputs.append(x)
    graph.outputs = [*outputs, x] if x not in outputs else outputs
    return graph


def _inputs(graph: Graph, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(graph.specs[i].shape).astype(np.float32) for i in graph.inputs]


@settings(max_examples=int(os.environ.get("EDGERUN_PASSES_EXAMPLES", "150")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graph=layout_chains(), seed=st.integers(0, 2**16))
def test_merged_layout_chain_is_bit_exact_and_never_larger(graph: Graph, seed: int) -> None:
    plain = DeadCodePass().call(DecomposePass().call(graph.copy()).graph).graph
    merged = RasterMergePass().call(plain.copy()).graph
    verify(merged)
    assert len(merged.nodes) <= len(plain.nodes)
    assert merged.outputs == plain.outputs
    inputs = _inputs(graph, seed)
    for want, got in zip(interpret(plain, inputs), interpret(merged, inputs)):
        assert want.shape == got.shape
        np.testing.assert_array_equal(got, want)


@settings(max_examples=int(os.environ.get("EDGERUN_PASSES_EXAMPLES", "150")) // 3, deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(chain=layout_chains(), seed=st.integers(0, 2**16))
def test_default_pipeline_on_a_chain_over_a_constant_is_exact(chain: Graph, seed: int) -> None:
    """The same chains, reading a weight instead of an input and added to an input: fold + merge stay exact."""
    rng = np.random.default_rng(seed)
    graph = chain.copy()
    weight = graph.inputs.pop(0)
    graph.constants[weight] = rng.standard_normal(graph.specs[weight].shape).astype(np.float32)
    b = Builder(graph)
    last = graph.outputs[-1]
    z = graph.add_input("z", graph.specs[last])
    graph.outputs[-1] = b.emit("add", [last, z])
    optimized, records = optimize(graph)
    verify(optimized)
    assert optimized.outputs == graph.outputs
    # Counted before optimize gives output names back (which may add a copy for an output listed twice).
    assert sum(records[-1].ops_after.values()) <= sum(records[0].ops_after.values())
    inputs = _inputs(graph, seed)
    for want, got in zip(interpret(graph, inputs), interpret(optimized, inputs)):
        np.testing.assert_array_equal(got, want)
