"""ONNX Resize (nearest, linear) and ConvTranspose import as the IR's composites, stay whole in the program,
and reach ONNX Runtime as one Resize / ConvTranspose node that agrees with ORT on the original model."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgerun.backends.onnxruntime import build_model
from edgerun.frontends.onnx import from_onnx
from edgerun.runtime import load

RNG = np.random.default_rng(5)


def _model(node, inits, in_shape, out_shape):
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, in_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _resize(mode: str, ctm: str):
    scales = numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales")
    roi = numpy_helper.from_array(np.zeros(0, np.float32), "roi")
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode=mode, coordinate_transformation_mode=ctm,
                            nearest_mode="floor")
    return _model(node, [roi, scales], [1, 3, 5, 6], [1, 3, 10, 9]), "resize", "Resize"


def _conv_transpose():
    w = numpy_helper.from_array(RNG.standard_normal((4, 3, 2, 2)).astype(np.float32), "w")
    b = numpy_helper.from_array(RNG.standard_normal(3).astype(np.float32), "b")
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], kernel_shape=[2, 2])
    return _model(node, [w, b], [1, 4, 5, 6], [1, 3, 10, 12]), "conv_transpose2d", "ConvTranspose"


@pytest.mark.parametrize("make", [lambda: _resize("nearest", "asymmetric"), lambda: _resize("linear", "half_pixel"),
                                  _conv_transpose], ids=["nearest", "linear", "conv_transpose"])
def test_composite_reaches_onnxruntime_whole(make) -> None:
    model, op, onnx_op = make()
    program = from_onnx(model)
    assert [n.op for n in program.graph.nodes] == [op]
    loaded = load(program, backends=["onnxruntime"])
    (part,) = loaded.parts.partitions
    emitted = build_model(part.subgraph(loaded.parts.graph))[0]
    assert [n.op_type for n in emitted.graph.node] == [onnx_op]
    x = RNG.standard_normal((1, 3 if op == "resize" else 4, 5, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(loaded(x), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(load(program, backends=["reference"])(x), want, rtol=1e-5, atol=1e-5)
