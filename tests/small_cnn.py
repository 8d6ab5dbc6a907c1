"""A small float conv + linear program for the quantization and npu tests: both integer layer kinds,
one graph input named "image"."""

from __future__ import annotations

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.program import Program


def small_cnn(shape: tuple[int, int, int, int] = (4, 3, 16, 16), hidden: int = 64, seed: int = 0) -> Program:
    """conv(pad, bias)-relu-conv(stride 2)-relu-mean-linear-relu-linear on `shape` (3 input channels)."""
    rng = np.random.default_rng(seed)
    g = Graph()
    b = Builder(g)
    x = g.add_input("image", TensorSpec(shape, DType.float32))

    def w(*dims: int) -> str:
        fan_in = int(np.prod(dims[1:])) if len(dims) == 4 else dims[0]
        return b.const((rng.standard_normal(dims) / np.sqrt(fan_in)).astype(np.float32))

    def relu(v: str) -> str:
        return b.emit("maximum", [v, b.scalar(0.0, v)])

    h = relu(b.emit("conv2d", [x, w(8, 3, 3, 3), b.const(rng.standard_normal(8).astype(np.float32) * 0.1)],
                    padding=[1, 1, 1, 1]))
    h = relu(b.emit("conv2d", [h, w(16, 8, 3, 3)], padding=[1, 1, 1, 1], stride=[2, 2]))
    h = b.emit("reduce_mean", [h], axes=[2, 3])
    h = relu(b.emit("matmul", [h, w(16, hidden)]))
    g.outputs = [b.emit("matmul", [h, w(hidden, 10)])]
    return Program(graph=g)
