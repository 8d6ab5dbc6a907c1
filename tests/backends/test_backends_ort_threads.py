"""Which ONNX Runtime partitions get the thread pool (backends/onnxruntime: `pooled`).

A sleeping pool pays a wake-up in every op it runs in parallel, so a partition gets it only when it does
enough work in all and its ops average enough work each: one GEMM among a hundred tiny ops (DIN's train
step) runs on one thread, the same GEMM with a few ops around it on the pool. A spinning pool pays no
wake-up and keeps the older, looser rule.
"""

from __future__ import annotations

import numpy as np

from edgerun.backends.base import node_work
from edgerun.backends.onnxruntime import (
    POOL_NODE_FLOPS,
    SMALL_PARTITION_FLOPS,
    SPIN_POOL_NODE_FLOPS,
    create_backend,
    pooled,
)
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec


def gemm_among_adds(adds: int) -> Graph:
    """An 8.4 MFLOP matmul [64,256]x[256,256] followed by `adds` adds of 16K elements each."""
    rng = np.random.default_rng(3)
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((64, 256), DType.float32))
    w = g.add_constant(rng.standard_normal((256, 256)).astype(np.float32), name="w")
    y = b.emit("matmul", [x, w])
    for i in range(adds):
        y = b.binary("add", y, b.const(np.full((256,), i, np.float32)))
    g.outputs = [y]
    return g


def test_the_rule_on_work_in_all_and_per_op() -> None:
    assert not pooled(SMALL_PARTITION_FLOPS / 2, 1, spin=False)  # too little work
    assert pooled(SMALL_PARTITION_FLOPS, 1, spin=False)
    assert pooled(100 * POOL_NODE_FLOPS, 100, spin=False)
    assert not pooled(99 * POOL_NODE_FLOPS, 100, spin=False)  # enough work, too little of it per op
    # A spinning pool: a large partition always, a small one when its ops average 20 KFLOP.
    assert pooled(99 * POOL_NODE_FLOPS, 100, spin=True)
    assert pooled(10 * SPIN_POOL_NODE_FLOPS, 10, spin=True)
    assert not pooled(9 * SPIN_POOL_NODE_FLOPS, 10, spin=True)


def test_a_gemm_among_many_tiny_ops_runs_on_one_thread_unless_the_pool_spins() -> None:
    few, many = gemm_among_adds(3), gemm_among_adds(120)
    for g in (few, many):
        assert sum(node_work(n, g)[0] for n in g.nodes) >= SMALL_PARTITION_FLOPS
    assert sum(node_work(n, many)[0] for n in many.nodes) < POOL_NODE_FLOPS * len(many.nodes)
    sleeping = create_backend(threads=2, spin=False)
    assert sleeping.compile(few).info["threads"] == 2
    assert sleeping.compile(many).info["threads"] == 1
    assert create_backend(threads=2, spin=True).compile(many).info["threads"] == 2
