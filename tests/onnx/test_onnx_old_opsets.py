"""A model stamped with an opset below 7 imports when each op it uses is defined as at opset 7, and is refused
naming the op otherwise."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from edgerun.frontends.onnx import OnnxModelError, from_onnx
from edgerun.oracle import interpret
from tests.onnx.onnx_graphs import make_model, value_info


def test_ops_unchanged_since_opset_1_import():
    nodes = [helper.make_node("Not", ["x"], ["n"]), helper.make_node("Identity", ["n"], ["y"])]
    model = make_model(nodes, [value_info("x", [2, 3], TensorProto.BOOL)], [value_info("y", [2, 3], TensorProto.BOOL)],
                       opset=1)
    model.ir_version = 3
    x = np.array([[True, False, True], [False, False, True]])
    np.testing.assert_array_equal(interpret(from_onnx(model).graph, [x])[0], ~x)


def test_an_op_defined_differently_then_is_refused_by_name():
    # Add at opset 6 had the `broadcast` attribute (no implicit numpy broadcasting): its meaning changed at 7.
    model = make_model([helper.make_node("Add", ["a", "b"], ["y"])], [value_info("a", [2]), value_info("b", [2])],
                       [value_info("y", [2])], opset=6)
    model.ir_version = 3
    with pytest.raises(OnnxModelError, match="Add was defined differently"):
        from_onnx(model)
