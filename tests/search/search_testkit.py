"""Shared by the search tests: a small graph every engine runs."""

from __future__ import annotations

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec


def small_conv_net(size: int = 32, seed: int = 2) -> Graph:
    """Three 3x3 conv + ReLU blocks, 8 channels, on a [1, 8, size, size] input."""
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", TensorSpec((1, 8, size, size), DType.float32))
    rng = np.random.default_rng(seed)
    for _ in range(3):
        w = b.const(rng.standard_normal((8, 8, 3, 3)).astype(np.float32) * 0.1)
        v = b.emit("relu", [b.emit("conv2d", [v, w], padding=[1, 1, 1, 1])])
    g.outputs = [v]
    return g
