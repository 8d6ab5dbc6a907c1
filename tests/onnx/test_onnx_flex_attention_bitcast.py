"""ai.onnx.preview FlexAttention (score_mod / prob_mod graphs inlined) and BitCast match onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.onnx import from_onnx
from edgerun.oracle import interpret
from tests.onnx.onnx_graphs import make_model, value_info

RNG = np.random.default_rng(11)
PREVIEW = "ai.onnx.preview"


def _flex_model(q, k, v, elem=TensorProto.FLOAT, **attrs):
    node = helper.make_node("FlexAttention", ["Q", "K", "V"], ["Y"], domain=PREVIEW, **attrs)
    graph = helper.make_graph([node], "g", [value_info("Q", q, elem), value_info("K", k, elem),
                                            value_info("V", v, elem)], [value_info("Y", [*q[:3], v[3]], elem)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 26), helper.make_opsetid(PREVIEW, 1)],
                             ir_version=13)


def _mod_graph(op, constant):
    shape = ["B", "H", "L", "S"]
    return helper.make_graph([helper.make_node(op, ["s", "c"], ["out"])], "mod", [value_info("s", shape)],
                             [value_info("out", shape)], initializer=[helper.make_tensor("c", TensorProto.FLOAT,
                                                                                         [], [constant])])


def _check(model, feeds, rtol=1e-5):
    want = ReferenceEvaluator(model).run(None, feeds)
    graph = from_onnx(model).graph
    got = interpret(graph, [feeds[n] for n in graph.inputs])
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("attrs", [
    {},
    {"scale": 0.3},
    {"score_mod": _mod_graph("Mul", 0.5)},  # a temperature on the scores
    {"prob_mod": _mod_graph("Add", 0.01), "softmax_precision": TensorProto.FLOAT},
], ids=["plain", "scale", "score_mod", "prob_mod"])
def test_flex_attention_with_grouped_heads(attrs):
    q, k, v = (2, 4, 3, 8), (2, 2, 5, 8), (2, 2, 5, 6)  # 4 query heads share 2 key/value heads
    feeds = {n: RNG.standard_normal(s).astype(np.float32) for n, s in zip("QKV", (q, k, v))}
    _check(_flex_model(q, k, v, **attrs), feeds)


def test_flex_attention_float16_computes_softmax_in_float32():
    shape = (1, 2, 3, 4)
    feeds = {n: RNG.standard_normal(shape).astype(np.float16) for n in "QKV"}
    _check(_flex_model(shape, shape, shape, TensorProto.FLOAT16), feeds, rtol=1e-3)


def test_flex_attention_head_counts_that_do_not_divide_are_refused():
    model = _flex_model((1, 3, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4))
    with pytest.raises(UnsupportedOpError, match="FlexAttention"):
        from_onnx(model)


@pytest.mark.parametrize("src,dst,values", [
    (TensorProto.FLOAT, TensorProto.INT32, np.array([1.0, -0.0, np.nan, np.inf], np.float32)),
    (TensorProto.INT64, TensorProto.DOUBLE, np.array([1, -1, 0x7FF0000000000000], np.int64)),
    (TensorProto.UINT16, TensorProto.FLOAT16, np.array([0x3C00, 0xFFFF, 1], np.uint16)),
])
def test_bitcast_reinterprets_the_bytes(src, dst, values):
    model = make_model([helper.make_node("BitCast", ["x"], ["y"], to=dst)], [value_info("x", list(values.shape), src)],
                       [value_info("y", list(values.shape), dst)], opset=26)
    model.ir_version = 13
    want = ReferenceEvaluator(model).run(None, {"x": values})[0]
    got = interpret(from_onnx(model).graph, [values])[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))  # bit for bit, NaN payloads too


def test_bitcast_between_widths_is_refused():
    model = make_model([helper.make_node("BitCast", ["x"], ["y"], to=TensorProto.INT64)],
                       [value_info("x", [2], TensorProto.FLOAT)], [value_info("y", [2], TensorProto.INT64)], opset=26)
    model.ir_version = 13
    with pytest.raises(EdgerunError, match=r"BitCast|bitcast"):
        from_onnx(model)
