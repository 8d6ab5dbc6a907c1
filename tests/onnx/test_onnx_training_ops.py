"""ONNX's optimizer update ops (Adagrad, Adam, Momentum) import as arithmetic and match onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx import from_onnx
from edgerun.oracle import interpret

TRAINING = "ai.onnx.preview.training"
RNG = np.random.default_rng(3)


def _model(op, n_tensors, accumulators, **attrs):
    streams = ["X", "G"] + [f"A{k}" for k in range(accumulators)]
    names = [f"{s}{i}" for s in streams for i in range(n_tensors)]
    outs = [f"{s}{i}_new" for s in ["X", *streams[2:]] for i in range(n_tensors)]
    node = helper.make_node(op, ["R", "T", *names], outs, domain=TRAINING, **attrs)
    inputs = [helper.make_tensor_value_info("R", TensorProto.FLOAT, []),
              helper.make_tensor_value_info("T", TensorProto.INT64, [])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 2]) for n in names]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 2]) for n in outs]
    graph = helper.make_graph([node], "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(TRAINING, 1)],
                             ir_version=8), ["R", "T", *names]


CASES = [
    ("Adagrad", 1, {"decay_factor": 0.1, "epsilon": 1e-5, "norm_coefficient": 0.001}),
    ("Adam", 2, {"alpha": 0.9, "beta": 0.99, "epsilon": 1e-4, "norm_coefficient": 0.01,
                 "norm_coefficient_post": 0.02}),
    ("Momentum", 1, {"alpha": 0.9, "beta": 0.5, "mode": "standard", "norm_coefficient": 0.01}),
    ("Momentum", 1, {"alpha": 0.9, "beta": 0.5, "mode": "nesterov", "norm_coefficient": 0.01}),
]


@pytest.mark.parametrize("op,accumulators,attrs", CASES, ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("n_tensors", [1, 2])
@pytest.mark.parametrize("step", [0, 3])
def test_update_matches_onnx_reference(op, accumulators, attrs, n_tensors, step):
    model, names = _model(op, n_tensors, accumulators, **attrs)
    feeds = {n: RNG.random((3, 2), dtype=np.float32) + 0.1 for n in names[2:]}
    feeds["R"] = np.array(0.1, dtype=np.float32)
    feeds["T"] = np.array(step, dtype=np.int64)  # step 0 takes the other branch of Adam / Momentum
    want = ReferenceEvaluator(model).run(None, feeds)
    graph = from_onnx(model).graph
    got = interpret(graph, [feeds[n] for n in graph.inputs])
    assert len(got) == len(want) == n_tensors * (1 + accumulators)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_gradient_is_refused_by_name():
    node = helper.make_node("Gradient", ["x"], ["dy_dx"], domain=TRAINING, xs=["x"], y="y")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("dy_dx", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(TRAINING, 1)],
                              ir_version=8)
    with pytest.raises(UnsupportedOpError, match="Gradient"):
        from_onnx(model)


def test_batch_norm_in_training_mode_uses_the_batch_statistics():
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "m_out", "v_out"],
                            training_mode=1, momentum=0.8, epsilon=1e-3)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3, 5])]
    inputs += [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3]) for n in "sbmv"]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3, 5]),
               helper.make_tensor_value_info("m_out", TensorProto.FLOAT, [3]),
               helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [3])]
    model = helper.make_model(helper.make_graph([node], "g", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", 15)], ir_version=8)
    feeds = {"x": RNG.standard_normal((4, 3, 5)).astype(np.float32)}
    feeds.update({n: RNG.random(3, dtype=np.float32) + 0.5 for n in "sbmv"})
    want = ReferenceEvaluator(model).run(None, feeds)
    graph = from_onnx(model).graph
    got = interpret(graph, [feeds[n] for n in graph.inputs])
    assert len(got) == 3
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
