"""matmul_int4 with activations="int8" (the input rounded to int8 per row and group, llama.cpp's Q8 activations):
the exact reference kernel against ONNX Runtime's MatMulNBits at accuracy_level 4, and its error against
float activations. Added for LLM decoding (edgerun/llm, docs/llm.md)."""

from __future__ import annotations

import numpy as np
import pytest

from edgerun.backends.onnxruntime import create_backend
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle.interpreter import interpret
from edgerun.oracle.quant_kernels import pack_int4, quantize_int8_groups


def _graph(m: int, k: int, n: int, group: int, with_zp: bool, activations: str, seed: int) -> Graph:
    rng = np.random.default_rng(seed)
    blocks = -(-k // group)
    g = Graph()
    a = g.add_input("a", TensorSpec((m, k), DType.float32))
    ins = [a, g.add_constant(pack_int4(rng.integers(0, 16, (n, blocks, group)).astype(np.uint8))),
           g.add_constant((rng.random((n, blocks)) * 0.1 + 0.01).astype(np.float32))]
    if with_zp:
        ins.append(g.add_constant(rng.integers(0, 16, (n, blocks)).astype(np.uint8)))
    g.outputs = [Builder(g).emit("matmul_int4", ins, k=k, n=n, group_size=group, activations=activations)]
    return g


@pytest.mark.parametrize("m,k,n,group,with_zp", [(1, 576, 64, 32, False), (3, 200, 24, 32, True),
                                                 (5, 1536, 40, 64, False), (1, 576, 49, 32, True)])
def test_int8_activations_match_onnxruntime_accuracy_level_4(m: int, k: int, n: int, group: int, with_zp: bool) -> None:
    graph = _graph(m, k, n, group, with_zp, "int8", seed=k + n)
    x = (np.random.default_rng(m).standard_normal((m, k)) * 3).astype(np.float32)
    ort = create_backend()
    assert ort.supports(graph.nodes[0], graph)
    got = ort.compile(graph)(x)
    got = got[0] if isinstance(got, (list, tuple)) else got
    want = interpret(graph, [x], decompose=False)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)  # float32 block sums in another order
    exact = interpret(_graph(m, k, n, group, with_zp, "float", seed=k + n), [x], decompose=False)[0]
    err = np.abs(want - exact).max() / np.abs(exact).max()
    assert 0 < err < 0.02  # rounding the input to 8 bits: visible, and small


def test_int8_group_rounding() -> None:
    a = np.array([[0.0] * 32 + [1.0, -2.54] + [0.5] * 30], np.float32)
    codes, scale = quantize_int8_groups(a, 32)
    assert scale[0, 0] == 0 and not codes[0, 0].any()  # an all-zero group: scale 0, codes 0
    assert scale[0, 1] == np.float32(2.54) / np.float32(127) and codes[0, 1, 1] == -127 and codes[0, 1, 0] == 50


def test_int8_activations_need_integer_zero_points() -> None:
    g = Graph()
    a = g.add_input("a", TensorSpec((1, 32), DType.float32))
    ins = [a, g.add_constant(np.zeros((2, 1, 16), np.uint8)), g.add_constant(np.ones((2, 1), np.float32)),
           g.add_constant(np.full((2, 1), 7.5, np.float32))]
    with pytest.raises(ValueError, match="integer"):
        Builder(g).emit("matmul_int4", ins, k=32, n=2, group_size=32, activations="int8")
    with pytest.raises(ValueError, match="activations"):
        Builder(g).emit("matmul_int4", ins[:3], k=32, n=2, group_size=32, activations="int4")
