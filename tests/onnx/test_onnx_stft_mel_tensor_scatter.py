"""ONNX STFT (framed, windowed forward DFTs), MelWeightMatrix (a constant filter bank), TensorScatter (a
KV-cache write at run-time indices) and scatter with reduction='mul' and 'add' match onnx.reference."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx import from_onnx
from edgerun.oracle import interpret
from tests.onnx.onnx_graphs import make_model, value_info

RNG = np.random.default_rng(2)


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("with_window", [False, True])
def test_stft_matches_onnx_reference(onesided, with_window):
    inputs = ["signal", "step", "window" if with_window else "", "" if with_window else "length"]
    node = helper.make_node("STFT", inputs, ["y"], onesided=onesided)
    inits = [helper.make_tensor("step", TensorProto.INT64, [], [5])]
    if with_window:
        inits.append(helper.make_tensor("window", TensorProto.FLOAT, [12], np.hanning(12).astype(np.float32)))
    else:
        inits.append(helper.make_tensor("length", TensorProto.INT64, [], [12]))
    model = make_model([node], [value_info("signal", [2, 64, 1])], [value_info("y", [2, 11, 7 if onesided else 12, 2])], inits,
                       opset=17)
    x = RNG.standard_normal((2, 64, 1)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"signal": x})[0]
    got = interpret(from_onnx(model).graph, [x])[0]
    assert got.shape == want.shape == (2, 11, 7 if onesided else 12, 2)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_mel_weight_matrix_is_a_constant_as_onnx_computes_it():
    names = ["bins", "dft", "rate", "low", "high"]
    inits = [helper.make_tensor("bins", TensorProto.INT32, [], [10]),
             helper.make_tensor("dft", TensorProto.INT32, [], [64]),
             helper.make_tensor("rate", TensorProto.INT32, [], [16000]),
             helper.make_tensor("low", TensorProto.FLOAT, [], [20.0]),
             helper.make_tensor("high", TensorProto.FLOAT, [], [7600.0])]
    model = make_model([helper.make_node("MelWeightMatrix", names, ["w"])], [], [value_info("w", [33, 10])], inits)
    want = ReferenceEvaluator(model).run(None, {})[0]
    program = from_onnx(model)
    assert not program.graph.nodes  # folded at import
    got = interpret(program.graph, [])[0]
    assert got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_mel_edges_beyond_the_spectrum_are_refused():
    inits = [helper.make_tensor("bins", TensorProto.INT32, [], [10]),
             helper.make_tensor("dft", TensorProto.INT32, [], [16]),
             helper.make_tensor("rate", TensorProto.INT32, [], [8000]),
             helper.make_tensor("low", TensorProto.FLOAT, [], [20.0]),
             helper.make_tensor("high", TensorProto.FLOAT, [], [30000.0])]
    model = make_model([helper.make_node("MelWeightMatrix", ["bins", "dft", "rate", "low", "high"], ["w"])], [],
                       [value_info("w", [9, 10])], inits)
    with pytest.raises(UnsupportedOpError, match="MelWeightMatrix"):
        from_onnx(model)


@pytest.mark.parametrize("mode", ["linear", "circular"])
@pytest.mark.parametrize("elem", [TensorProto.FLOAT, TensorProto.INT64])
def test_tensor_scatter_writes_each_row_at_its_run_time_index(mode, elem):
    node = helper.make_node("TensorScatter", ["past", "update", "where"], ["present"], mode=mode, axis=2)
    model = make_model([node], [value_info("past", [3, 2, 6, 4], elem), value_info("update", [3, 2, 3, 4], elem),
                                value_info("where", [3], TensorProto.INT64)],
                       [value_info("present", [3, 2, 6, 4], elem)], opset=24)
    model.ir_version = 10
    dtype = np.float32 if elem == TensorProto.FLOAT else np.int64
    feeds = {"past": (RNG.standard_normal((3, 2, 6, 4)) * 1e6).astype(dtype),
             "update": (RNG.standard_normal((3, 2, 3, 4)) * 1e6).astype(dtype),
             "where": np.array([0, 3, 5 if mode == "circular" else 2], np.int64)}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    graph = from_onnx(model).graph
    got = interpret(graph, [feeds[n] for n in graph.inputs])[0]
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)


def test_scatter_elements_multiplies_repeated_indices_in_order():
    node = helper.make_node("ScatterElements", ["data", "idx", "upd"], ["y"], axis=1, reduction="mul")
    model = make_model([node], [value_info("data", [2, 5]), value_info("idx", [2, 4], TensorProto.INT64),
                                value_info("upd", [2, 4])], [value_info("y", [2, 5])], opset=18)
    feeds = {"data": RNG.standard_normal((2, 5)).astype(np.float32),
             "idx": np.array([[1, 1, 3, 1], [0, 4, 4, 2]], np.int64),  # repeated positions multiply together
             "upd": RNG.standard_normal((2, 4)).astype(np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    graph = from_onnx(model).graph
    got = interpret(graph, [feeds[n] for n in graph.inputs])[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("op", ["ScatterND", "ScatterElements"])
def test_scatter_add_is_one_scatter_add_and_sums_repeated_indices(op):
    if op == "ScatterND":  # rows of a [4, 3] tensor, row 1 three times
        shapes, idx = ([4, 3], [5, 1], [5, 3]), np.array([[1], [3], [1], [-1], [1]], np.int64)
        node = helper.make_node(op, ["data", "idx", "upd"], ["y"], reduction="add")
    else:
        shapes, idx = ([2, 5], [2, 4], [2, 4]), np.array([[1, 1, 3, -1], [0, 4, 4, 2]], np.int64)
        node = helper.make_node(op, ["data", "idx", "upd"], ["y"], axis=1, reduction="add")
    model = make_model([node], [value_info("data", shapes[0]), value_info("idx", shapes[1], TensorProto.INT64),
                                value_info("upd", shapes[2])], [value_info("y", shapes[0])], opset=18)
    feeds = {"data": RNG.standard_normal(shapes[0]).astype(np.float32), "idx": idx,
             "upd": RNG.standard_normal(shapes[2]).astype(np.float32)}
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    graph = from_onnx(model).graph
    assert [n.op for n in graph.nodes].count("scatter_add") == 1
    got = interpret(graph, [feeds[n] for n in graph.inputs])[0]
    np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("length", [None, 8, 9])
def test_one_sided_inverse_dft_matches_numpy_irfft(length):
    inputs = ["x", "n" if length else "", "axis"]
    inits = [helper.make_tensor("axis", TensorProto.INT64, [], [1])]
    if length:
        inits.append(helper.make_tensor("n", TensorProto.INT64, [], [length]))
    n = length or 8
    model = make_model([helper.make_node("DFT", inputs, ["y"], inverse=1, onesided=1)], [value_info("x", [2, 5, 2])],
                       [value_info("y", [2, n, 1])], inits, opset=20)
    x = RNG.standard_normal((2, 5, 2)).astype(np.float32)
    want = np.fft.irfft(x[..., 0].astype(np.float64) + 1j * x[..., 1], n=n, axis=1)[..., None]
    got = interpret(from_onnx(model).graph, [x])[0]
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
