"""Small graphs with each control-flow op (cond, while_loop, scan), shared by the IR, runtime and backend tests."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.subgraphs import add_subgraph
from edgerun.ir.tensor_spec import TensorSpec

F32 = DType.float32
I64 = DType.int64


def body(fn: Callable[..., Sequence[str]], specs: Sequence[TensorSpec]) -> Graph:
    """A closed body: inputs a0, a1, ... of `specs`, outputs what `fn(builder, *inputs)` returns."""
    g = Graph()
    b = Builder(g)
    ins = [g.add_input(f"a{i}", s) for i, s in enumerate(specs)]
    g.outputs = list(fn(b, *ins))
    return g


def cond_graph(then_op: str = "gelu") -> Graph:
    """y = then_op(x) * w if p else -x (then's weight w lives in the body)."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((3,), F32))
    p = g.add_input("p", TensorSpec((), DType.bool))
    w = np.array([1.0, 2.0, 3.0], np.float32)
    then = add_subgraph(g, body(lambda b, a: [b.emit("mul", [b.emit(then_op, [a]), b.const(w)])],
                                [TensorSpec((3,), F32)]), "then")
    other = add_subgraph(g, body(lambda b, a: [b.emit("neg", [a])], [TensorSpec((3,), F32)]), "else")
    g.outputs = [b.emit("cond", [p, x], then=then, **{"else": other})]
    return g


def while_graph() -> Graph:
    """(i, y) = (n, x * 2^n + (2^n - 1)): `while i < n: i, x = i + 1, 2x + 1`; n is an input."""
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((3,), F32))
    n = g.add_input("n", TensorSpec((), I64))
    specs = [TensorSpec((), I64), TensorSpec((3,), F32), TensorSpec((), I64)]
    cond = add_subgraph(g, body(lambda b, i, x, n: [b.emit("lt", [i, n])], specs), "cond")
    step = add_subgraph(g, body(lambda b, i, x, n: [
        b.emit("add", [i, b.const(np.array(1, np.int64))]),
        b.emit("add", [b.emit("mul", [x, b.const(np.array(2, np.float32))]), b.const(np.array(1, np.float32))])],
        specs), "body")
    g.outputs = b.emit_multi("while_loop", [b.const(np.array(0, np.int64)), x, n], cond=cond, body=step,
                             num_carried=2)
    return g


def scan_graph() -> Graph:
    """Running sum of the rows of xs (4, 3) from h0, and relu(h - row) at each step, scaled by k."""
    g = Graph()
    b = Builder(g)
    h0 = g.add_input("h0", TensorSpec((3,), F32))
    xs = g.add_input("xs", TensorSpec((4, 3), F32))
    k = g.add_input("k", TensorSpec((), F32))
    step = add_subgraph(g, body(lambda b, h, row, k: [
        b.emit("add", [h, row]), b.emit("mul", [b.emit("relu", [b.emit("sub", [h, row])]), k])],
        [TensorSpec((3,), F32), TensorSpec((3,), F32), TensorSpec((), F32)]), "step")
    g.outputs = b.emit_multi("scan", [h0, xs, k], body=step, num_carried=1, num_sequences=1, length=4)
    return g


def scan_expected(h0: np.ndarray, xs: np.ndarray, k: float) -> tuple[np.ndarray, np.ndarray]:
    h, ys = h0, []
    for row in xs:
        ys.append(np.maximum(h - row, 0) * k)
        h = h + row
    return h, np.stack(ys)
