"""ConstantFoldPass and ConvAffineFoldPass: what folds, what must not, and the numbers stay the same."""

from __future__ import annotations

import numpy as np
import pytest
from passes_testkit import assert_same_outputs, decomposed, graph_with_input

from edgerun.ir.dtypes import DType
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.passes.constant_fold_pass import SMALL_CONSTANT_BYTES, ConstantFoldPass
from edgerun.passes.conv_affine_fold_pass import ConvAffineFoldPass
from edgerun.passes.dead_code_pass import DeadCodePass

RNG = np.random.default_rng(0)


def _rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def _fold(graph):
    plain = decomposed(graph)
    folded = ConstantFoldPass().call(plain.copy()).graph
    return plain, folded


def test_linear_weight_is_stored_pre_transposed() -> None:
    g, b, x = graph_with_input((2, 8))
    w = b.const(_rand(4, 8))
    g.outputs = [b.emit("linear", [x, w])]
    plain, folded = _fold(g)
    assert plain.op_counts() == {"matmul": 1, "raster": 1}
    assert folded.op_counts() == {"matmul": 1}
    (weight,) = folded.constants.values()
    np.testing.assert_array_equal(weight, plain.constants[w].T)
    assert_same_outputs(plain, folded, rtol=1e-6)


def test_constant_subgraph_collapses_and_inputs_are_dropped() -> None:
    g, b, x = graph_with_input((3,))
    c = b.emit("exp", [b.emit("add", [b.const(_rand(3)), b.const(_rand(3))])])
    g.outputs = [b.emit("mul", [x, c])]
    plain, folded = _fold(g)
    assert folded.op_counts() == {"mul": 1}
    assert len(folded.constants) == 1
    assert_same_outputs(plain, folded, rtol=1e-6)


def test_broadcast_of_a_scalar_to_a_large_tensor_is_not_folded() -> None:
    g, b, x = graph_with_input((64, 64))
    big = b.emit("expand", [b.const(np.float32(2.0).reshape(1, 1))], shape=[64, 64])
    g.outputs = [b.emit("add", [x, big])]
    plain, folded = _fold(g)
    assert folded.op_counts() == plain.op_counts()
    assert folded.weight_bytes() < SMALL_CONSTANT_BYTES


def test_small_broadcast_is_folded() -> None:
    g, b, x = graph_with_input((4, 4))
    small = b.emit("expand", [b.const(np.float32(2.0).reshape(1, 1))], shape=[4, 4])
    g.outputs = [b.emit("add", [x, small])]
    plain, folded = _fold(g)
    assert folded.op_counts() == {"add": 1}
    assert_same_outputs(plain, folded)


def test_a_weight_read_twice_is_not_duplicated_by_folding() -> None:
    # Tied embeddings: the table is gathered from and also used transposed as the output projection.
    g, b, x = graph_with_input((2, 32))
    table = b.const(_rand(64, 32))  # 8 KiB: above the small-constant allowance
    ids = g.add_input("ids", TensorSpec((2,), DType.int64))
    emb = b.emit("gather", [table, ids])
    g.outputs = [b.emit("add", [b.emit("linear", [x, table]), b.emit("reduce_sum", [emb])])]
    plain, folded = _fold(g)
    assert folded.weight_bytes() <= plain.weight_bytes()
    assert "raster" in folded.op_counts()
    assert_same_outputs(plain, folded, rtol=1e-6)


def test_graph_output_computed_from_constants_stays_a_node() -> None:
    g, b, x = graph_with_input((2,))
    g.outputs = [b.emit("exp", [b.const(_rand(2))]), b.emit("neg", [x])]
    _, folded = _fold(g)
    assert folded.op_counts() == {"exp": 1, "neg": 1}


def _conv_bn(groups: int, bias: bool, channels: int = 4) -> tuple:
    g, b, x = graph_with_input((2, channels, 6, 6))
    w = b.const(_rand(channels, channels // groups, 3, 3))
    ins = [x, w, b.const(_rand(channels))] if bias else [x, w]
    y = b.emit("conv2d", ins, padding=[1, 1, 1, 1], groups=groups)
    stats = [b.const(_rand(channels)), b.const(_rand(channels)), b.const(_rand(channels)),
             b.const(np.abs(_rand(channels)) + 0.5)]
    return g, b, b.emit("batch_norm", [y, *stats], eps=1e-5), y


@pytest.mark.parametrize(("groups", "bias"), [(1, True), (1, False), (2, True), (4, False)])
def test_batch_norm_disappears_into_the_conv(groups: int, bias: bool) -> None:
    g, b, out, _ = _conv_bn(groups, bias)
    g.outputs = [b.emit("relu", [out])]
    plain = decomposed(g)
    folded = ConvAffineFoldPass().call(ConstantFoldPass().call(plain.copy()).graph).graph
    folded = DeadCodePass().call(folded).graph
    assert folded.op_counts() == {"conv2d": 1, "maximum": 1}
    (conv,) = [n for n in folded.nodes if n.op == "conv2d"]
    assert len(conv.inputs) == 3 and conv.attrs["groups"] == groups
    assert_same_outputs(plain, folded, rtol=1e-5)


def test_conv_with_another_reader_keeps_its_batch_norm() -> None:
    g, b, out, y = _conv_bn(1, True)
    g.outputs = [out, b.emit("exp", [y])]
    plain = decomposed(g)
    folded = ConvAffineFoldPass().call(ConstantFoldPass().call(plain.copy()).graph).graph
    assert folded.op_counts()["mul"] == 1 and folded.op_counts()["add"] == 1
    assert_same_outputs(plain, folded, rtol=1e-5)


@pytest.mark.parametrize("op", ["mul", "add", "sub", "div"])
def test_per_channel_and_scalar_affine_ops_fold_into_the_conv(op: str) -> None:
    g, b, x = graph_with_input((1, 3, 5, 5))
    y = b.emit("conv2d", [x, b.const(_rand(4, 3, 3, 3))])
    y = b.emit(op, [y, b.const(np.abs(_rand(4, 1, 1)) + 0.5)])
    y = b.emit(op, [y, b.const(np.float32(1.5))])
    g.outputs = [b.emit("exp", [y])]
    plain = decomposed(g)
    folded = ConvAffineFoldPass().call(plain.copy()).graph
    assert folded.op_counts() == {"conv2d": 1, "exp": 1}
    assert_same_outputs(plain, folded, rtol=1e-5)


def test_constant_minus_conv_and_spatial_constants_do_not_fold() -> None:
    g, b, x = graph_with_input((1, 3, 5, 5))
    y = b.emit("conv2d", [x, b.const(_rand(4, 3, 3, 3))])
    y = b.emit("sub", [b.const(_rand(4, 1, 1)), y])  # c - conv is not conv + c
    z = b.emit("conv2d", [x, b.const(_rand(4, 3, 3, 3))])
    z = b.emit("mul", [z, b.const(_rand(1, 3, 3))])  # varies over space, not per channel
    g.outputs = [y, z]
    plain = decomposed(g)
    folded = ConvAffineFoldPass().call(plain.copy()).graph
    assert folded.op_counts() == plain.op_counts()
    assert_same_outputs(plain, folded)


def test_conv_output_that_is_a_graph_output_is_not_folded() -> None:
    g, b, x = graph_with_input((1, 3, 5, 5))
    y = b.emit("conv2d", [x, b.const(_rand(4, 3, 3, 3))])
    g.outputs = [y, b.emit("mul", [y, b.const(_rand(4, 1, 1))])]
    plain = decomposed(g)
    folded = ConvAffineFoldPass().call(plain.copy()).graph
    assert folded.op_counts() == {"conv2d": 1, "mul": 1}
