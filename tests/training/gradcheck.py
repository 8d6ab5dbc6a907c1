"""Checking a gradient rule against float64 central finite differences, through the oracle."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle.interpreter import interpret
from edgerun.passes.autodiff import gradient_graph

Emit = Callable[[Builder, list[str]], str]


def loss_graph(emit: Emit, inputs: Sequence[np.ndarray], seed: int = 0) -> Graph:
    """loss = sum(emit(inputs) * R), R a fixed random tensor: every output element weighs differently."""
    g = Graph()
    b = Builder(g)
    names = [g.add_input(f"x{i}", TensorSpec(a.shape, DType.of(a))) for i, a in enumerate(inputs)]
    y = emit(b, names)
    weights = np.random.default_rng(seed).standard_normal(b.shape(y))
    g.outputs = [b.emit("reduce_sum", [b.binary("mul", y, b.const(weights, DType.float64))])]
    return g


def check_gradient(emit: Emit, inputs: Sequence[np.ndarray], wrt: Sequence[int] | None = None,
                   eps: float = 1e-6, rtol: float = 1e-5, atol: float = 1e-7, directions: int = 0) -> None:
    """The rule's gradient of each input in `wrt` (default: every float64 input) equals finite differences:
    element by element, or with `directions` > 0 along that many random directions (two evaluations each
    instead of two per element)."""
    inputs = [np.asarray(a) for a in inputs]
    wrt = [i for i, a in enumerate(inputs) if a.dtype == np.float64] if wrt is None else list(wrt)
    g = loss_graph(emit, inputs)
    grad_graph = gradient_graph(g, g.outputs[0], [f"x{i}" for i in wrt])
    results = interpret(grad_graph, list(inputs))
    for k, i in enumerate(wrt):
        analytic = results[1 + k]
        if directions:
            rng = np.random.default_rng(k)
            for _ in range(directions):
                v = rng.standard_normal(inputs[i].shape)
                plus = [a + eps * v if j == i else a for j, a in enumerate(inputs)]
                minus = [a - eps * v if j == i else a for j, a in enumerate(inputs)]
                slope = (interpret(g, plus)[0] - interpret(g, minus)[0]) / (2 * eps)
                np.testing.assert_allclose(np.sum(analytic * v), slope, rtol=rtol, atol=atol,
                                           err_msg=f"gradient of input {i} ({inputs[i].shape}) along a direction")
            continue
        numeric = np.zeros_like(inputs[i])
        flat = numeric.reshape(-1)
        for j in range(inputs[i].size):
            plus = [a.copy() for a in inputs]
            minus = [a.copy() for a in inputs]
            plus[i].reshape(-1)[j] += eps
            minus[i].reshape(-1)[j] -= eps
            flat[j] = (interpret(g, plus)[0] - interpret(g, minus)[0]) / (2 * eps)
        np.testing.assert_allclose(analytic, numeric, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {i} ({inputs[i].shape})")
