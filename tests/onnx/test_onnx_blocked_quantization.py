"""Block-wise QuantizeLinear / DequantizeLinear (block_size, opset 21+) match onnx.reference, including an extent
that the block size does not divide."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgerun.frontends.onnx import from_onnx
from edgerun.oracle import interpret
from tests.onnx.onnx_graphs import make_model, value_info

RNG = np.random.default_rng(8)


@pytest.mark.parametrize("axis,shape,scale_shape", [(1, [3, 10], [3, 4]), (0, [7, 2], [3, 2])])
@pytest.mark.parametrize("elem", [TensorProto.INT8, TensorProto.UINT8, TensorProto.INT4])
def test_blocked_round_trip_matches_onnx_reference(axis, shape, scale_shape, elem):
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=axis, block_size=3),
             helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], axis=axis, block_size=3)]
    zp_dtype = {TensorProto.INT8: np.int8, TensorProto.UINT8: np.uint8, TensorProto.INT4: np.int8}[elem]
    zp = RNG.integers(0, 3, scale_shape).astype(zp_dtype)
    inits = [helper.make_tensor("s", TensorProto.FLOAT, scale_shape, RNG.random(scale_shape) * 0.1 + 0.01),
             helper.make_tensor("zp", elem, scale_shape, zp.reshape(-1).tolist())]
    model = make_model(nodes, [value_info("x", shape)], [value_info("q", shape, elem), value_info("y", shape)],
                       inits, opset=21)
    model.ir_version = 10
    x = RNG.standard_normal(shape).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"x": x})
    got = interpret(from_onnx(model).graph, [x])
    np.testing.assert_array_equal(got[0].astype(np.int32), want[0].astype(np.int32))
    np.testing.assert_allclose(got[1], want[1], rtol=1e-6, atol=1e-6)
