"""Shared by the runtime tests and benches: sample graphs and a second, genuinely separate backend.

InterpreterBackend runs each partition through the plain interpreter (`interpret`: fresh arrays per value,
kernels.py called per node), as a delegate: one call per partition on the runtime's boundary arrays. It is
the second implementation path that forced and alternating placements are checked against.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from edgerun.backends.base import Backend, CompiledPartition, OpSupport, Throughput
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import KERNELS, interpret

ELEMENTWISE = ("add", "sub", "mul", "maximum", "minimum", "exp", "tanh", "neg", "abs", "sigmoid")


class InterpreterBackend(Backend):
    """Runs partitions with the plain interpreter. `ops` limits what it claims (default: everything)."""

    throughput = Throughput(dispatch_s=2e-5)

    def __init__(self, name: str = "interp", ops: Sequence[str] | None = None) -> None:
        self.name = name  # type: ignore[misc]
        self.supported = {op: OpSupport() for op in (ops or KERNELS)}  # type: ignore[misc]
        self.compiled = 0

    def compile(self, subgraph: Graph) -> CompiledPartition:
        self.compiled += 1

        def run(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
            for dst, value in zip(outputs, interpret(subgraph, list(inputs), decompose=False)):
                np.copyto(dst, value)
        return CompiledPartition(self.name, subgraph, run)


class BrokenBackend(InterpreterBackend):
    """Claims every op and fails to compile anything: the runtime must fall back to reference."""

    def compile(self, subgraph: Graph) -> CompiledPartition:
        raise RuntimeError("this backend cannot compile anything")


def f32(*shape: int) -> TensorSpec:
    return TensorSpec(shape, DType.float32)


def small_cnn(seed: int = 0) -> Graph:
    """conv-bn-relu x2 with a residual, pooling, flatten, linear, softmax: composites included."""
    rng = np.random.default_rng(seed)
    g = Graph()
    b = Builder(g)
    x = g.add_input("image", f32(2, 3, 16, 16))

    def conv_bn_relu(v: str, cin: int, cout: int) -> str:
        w = b.const(rng.standard_normal((cout, cin, 3, 3)).astype(np.float32) * 0.3)
        bias = b.const(rng.standard_normal(cout).astype(np.float32) * 0.1)
        v = b.emit("conv2d", [v, w, bias], padding=[1, 1, 1, 1])
        stats = [b.const(rng.random(cout).astype(np.float32) + off) for off in (0.5, 0.0, 0.0, 0.5)]
        v = b.emit("batch_norm", [v, stats[0], stats[1], stats[2], stats[3]], eps=1e-5)
        return b.emit("relu", [v])

    h = conv_bn_relu(x, 3, 8)
    h2 = conv_bn_relu(h, 8, 8)
    h = b.emit("add", [h, h2])
    h = b.emit("max_pool2d", [h], kernel=2)
    h = b.emit("flatten", [h], start=1)
    w = b.const(rng.standard_normal((10, 8 * 8 * 8)).astype(np.float32) * 0.05)
    h = b.emit("linear", [h, w])
    g.outputs = [b.emit("softmax", [h], axis=-1)]
    return g


def small_transformer_block(seed: int = 0, seq: int = 8, dim: int = 16, heads: int = 2) -> Graph:
    """Pre-norm attention + MLP block with residuals; two outputs (the block output and the attention map input)."""
    rng = np.random.default_rng(seed)
    g = Graph()
    b = Builder(g)
    x = g.add_input("tokens", f32(1, seq, dim))

    def lin(v: str, i: int, o: int) -> str:
        w = b.const(rng.standard_normal((o, i)).astype(np.float32) / np.sqrt(i))
        bias = b.const(rng.standard_normal(o).astype(np.float32) * 0.1)
        return b.emit("linear", [v, w, bias])

    h = b.emit("layer_norm", [x], eps=1e-5)
    hd = dim // heads

    def split_heads(v: str) -> str:
        v = b.emit("reshape", [v], shape=[1, seq, heads, hd])
        return b.emit("transpose", [v], perm=[0, 2, 1, 3])

    q, k, v = (split_heads(lin(h, dim, dim)) for _ in range(3))
    a = b.emit("scaled_dot_product_attention", [q, k, v], is_causal=True)
    a = b.emit("transpose", [a], perm=[0, 2, 1, 3])
    a = b.emit("reshape", [a], shape=[1, seq, dim])
    x2 = b.emit("add", [x, lin(a, dim, dim)])
    m = b.emit("layer_norm", [x2], eps=1e-5)
    m = b.emit("gelu", [lin(m, dim, 4 * dim)])
    out = b.emit("add", [x2, lin(m, 4 * dim, dim)])
    g.outputs = [out, q]
    return g


def chain_of_adds(n: int, size: int = 4) -> Graph:
    """x + c0 + c1 + ... : n tiny elementwise instructions (the dispatch-overhead workload)."""
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", f32(size))
    for i in range(n):
        v = b.emit("add", [v, b.const(np.full(size, i, np.float32))])
    g.outputs = [v]
    return g


def random_dag(seed: int, nodes: int = 30, size: int = 6) -> Graph:
    """A random DAG of elementwise ops and reshapes over a few inputs, with several outputs."""
    r = random.Random(seed)
    g = Graph()
    b = Builder(g)
    values = [g.add_input(f"in{i}", f32(size)) for i in range(r.randint(1, 3))]
    for _ in range(nodes):
        kind = r.random()
        if kind < 0.15:
            src = r.choice(values)
            v = b.emit("reshape", [src], shape=[2, size // 2])
            v = b.emit("reshape", [v], shape=[size])
        elif kind < 0.35:
            v = b.emit(r.choice(("exp", "tanh", "neg", "abs")), [r.choice(values[-8:])])
        else:
            a = r.choice(values[-6:]) if r.random() < 0.7 else r.choice(values)
            c = r.choice(values) if r.random() < 0.8 else b.const(np.linspace(-1, 1, size, dtype=np.float32))
            v = b.emit(r.choice(("add", "sub", "mul", "maximum")), [a, c])
        values.append(v)
    tail = values[-1]
    extra = r.sample(values, k=min(2, len(values)))
    g.outputs = list(dict.fromkeys([tail, *extra]))
    return g


def random_inputs(graph: Graph, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(graph.specs[n].shape).astype(graph.specs[n].dtype.np) for n in graph.inputs]
