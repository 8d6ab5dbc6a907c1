"""Ops whose ONNX node cases are few, checked on random inputs against ONNX's reference implementation."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from edgerun.frontends.onnx import import_onnx_graph
from edgerun.oracle import interpret


def _model(node, inputs, out_shape, inits=(), opset=20):
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(n, 1, s) for n, s in inputs],
                              [helper.make_tensor_value_info(node.output[0], 1, out_shape)], initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


@pytest.mark.parametrize("mode,padding", itertools.product(["nearest", "linear", "cubic"],
                                                           ["zeros", "border", "reflection"]))
def test_grid_sample_random_grids(mode, padding):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    g = rng.uniform(-1.7, 1.7, (2, 4, 7, 2)).astype(np.float32)  # reaches outside the image
    for align in (0, 1):
        node = helper.make_node("GridSample", ["x", "g"], ["y"], mode=mode, padding_mode=padding, align_corners=align)
        m = _model(node, [("x", x.shape), ("g", g.shape)], [2, 3, 4, 7])
        want = ReferenceEvaluator(m).run(None, {"x": x, "g": g})[0]
        np.testing.assert_allclose(interpret(import_onnx_graph(m), [x, g])[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_coordinate_modes(mode):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 5, 7)).astype(np.float32)
    modes = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric",
             "tf_crop_and_resize"]
    for ctm, antialias in itertools.product(modes, [0, 1] if mode != "nearest" else [0]):
        roi = np.array([0, 0, 0.1, 0.2, 1, 1, 0.8, 0.9] if ctm == "tf_crop_and_resize" else [], np.float32)
        inits = [numpy_helper.from_array(roi, "roi"), numpy_helper.from_array(np.array([1, 1, 1.7, 0.6], np.float32), "s")]
        node = helper.make_node("Resize", ["x", "roi", "s"], ["y"], mode=mode, coordinate_transformation_mode=ctm,
                                antialias=antialias, extrapolation_value=-3.0)
        m = _model(node, [("x", x.shape)], [1, 2, 8, 4], inits, opset=19)
        want = ReferenceEvaluator(m).run(None, {"x": x})[0]
        np.testing.assert_allclose(interpret(import_onnx_graph(m), [x])[0], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op,lo,hi", [("Atan", -50.0, 50.0), ("Asin", -1.0, 1.0), ("Acos", -1.0, 1.0)])
def test_inverse_trig_accuracy(op, lo, hi):
    x = np.linspace(lo, hi, 20001).astype(np.float32)
    m = _model(helper.make_node(op, ["x"], ["y"]), [("x", x.shape)], list(x.shape), opset=17)
    got = interpret(import_onnx_graph(m), [x])[0].astype(np.float64)
    want = getattr(np, "arc" + op[1:].lower())(x.astype(np.float64))
    assert np.max(np.abs(got - want) / np.maximum(np.abs(want), 1e-6)) < 1e-6
