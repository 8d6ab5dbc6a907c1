"""ONNX Runtime's com.microsoft contrib ops, one node each, written from ORT's ContribOperators.md and
compared with ONNX Runtime's own kernels on the same inputs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, ValueInfoProto, helper, numpy_helper

from edgerun.frontends.onnx import from_onnx
from edgerun.oracle import interpret

ort = pytest.importorskip("onnxruntime")

F, I32, I64, U8, I8 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.UINT8, TensorProto.INT8
ELEM = {np.float32: F, np.int32: I32, np.int64: I64, np.uint8: U8, np.int8: I8}


def _check(op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray], outputs: list[str],
           inputs: list[str] | None = None, domain: str = "com.microsoft", rtol: float = 1e-5, atol: float = 1e-5,
           **attrs: Any) -> list[np.ndarray]:
    """One `op` node reading `inputs` (feeds and constants by name, "" for an absent optional input)."""
    order = inputs if inputs is not None else [*feeds, *consts]
    node = helper.make_node(op, order, outputs, domain=domain, **attrs)

    def model(typed: list[np.ndarray] | None) -> bytes:
        outs = [helper.make_tensor_value_info(n, ELEM[w.dtype.type], w.shape) for n, w in
                zip([n for n in outputs if n], typed)] if typed else \
            [ValueInfoProto(name=n) for n in outputs if n]  # untyped: ORT infers the contrib op's types
        graph = helper.make_graph(
            [node], "g", [helper.make_tensor_value_info(n, ELEM[v.dtype.type], v.shape) for n, v in feeds.items()],
            outs, initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()])
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()

    session = ort.InferenceSession(model(None), providers=["CPUExecutionProvider"])
    want = session.run(None, feeds)
    got = interpret(from_onnx(model(want)).graph, list(feeds.values()))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        if w.dtype.kind in "iu":
            np.testing.assert_array_equal(g, w)
        else:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return got


RNG = np.random.default_rng(0)


def _f(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op, with_bias", [("Gelu", False), ("BiasGelu", True), ("FastGelu", False),
                                           ("FastGelu", True), ("QuickGelu", False)])
def test_fused_activations(op: str, with_bias: bool) -> None:
    consts = {"bias": _f(16)} if with_bias else {}
    _check(op, {"x": _f(2, 3, 16) * 3}, consts, ["y"])


def test_quick_gelu_alpha() -> None:
    _check("QuickGelu", {"x": _f(4, 8) * 3}, {}, ["y"], alpha=1.25)


@pytest.mark.parametrize("with_beta, with_bias", [(True, True), (False, False)])
def test_skip_layer_normalization_and_its_sum_output(with_beta: bool, with_bias: bool) -> None:
    consts = {"gamma": _f(16), **({"beta": _f(16)} if with_beta else {})}
    inputs = ["x", "skip", "gamma", "beta" if with_beta else ""]
    if with_bias:
        consts["bias"] = _f(16)
        inputs.append("bias")
    _check("SkipLayerNormalization", {"x": _f(2, 5, 16), "skip": _f(2, 5, 16)}, consts,
           ["y", "", "", "sum"], inputs=inputs, epsilon=1e-5, atol=1e-4)


def test_skip_simplified_layer_normalization() -> None:
    _check("SkipSimplifiedLayerNormalization", {"x": _f(2, 5, 16), "skip": _f(2, 5, 16)}, {"gamma": _f(16)},
           ["y", "", "", "sum"], inputs=["x", "skip", "gamma"], epsilon=1e-6, atol=1e-4)


def test_simplified_layer_normalization_in_the_default_domain() -> None:
    _check("SimplifiedLayerNormalization", {"x": _f(3, 4, 32)}, {"scale": _f(32)}, ["y"], domain="",
           epsilon=1e-6, axis=-1, atol=1e-4)


@pytest.mark.parametrize("with_mask, with_segments", [(True, True), (False, False)])
def test_embed_layer_normalization(with_mask: bool, with_segments: bool) -> None:
    ids = RNG.integers(0, 50, (2, 7)).astype(np.int32)
    feeds = {"ids": ids}
    if with_segments:
        feeds["segments"] = RNG.integers(0, 2, (2, 7)).astype(np.int32)
    consts = {"word": _f(50, 16), "pos": _f(10, 16), "seg": _f(2, 16), "gamma": _f(16), "beta": _f(16)}
    inputs = ["ids", "segments" if with_segments else "", "word", "pos", "seg" if with_segments else "",
              "gamma", "beta"]
    if with_mask:
        feeds["mask"] = np.array([[1] * 7, [1] * 4 + [0] * 3], np.int32)
        inputs.append("mask")
    if not with_segments:
        del consts["seg"]
    _check("EmbedLayerNormalization", feeds, consts, ["y", "mask_index"], inputs=inputs, epsilon=1e-12, atol=1e-4)


def _attention_weights(hidden: int = 16) -> dict[str, np.ndarray]:
    return {"w": _f(hidden, 3 * hidden) * 0.3, "b": _f(3 * hidden) * 0.1}


@pytest.mark.parametrize("mask", ["none", "lengths", "end_start", "raw2d", "raw3d"])
def test_attention_mask_forms(mask: str) -> None:
    x = _f(2, 6, 16)
    feeds: dict[str, np.ndarray] = {"x": x}
    inputs = ["x", "w", "b"]
    masks = {"lengths": np.array([6, 3], np.int32), "end_start": np.array([5, 6, 1, 2], np.int32),
             "raw2d": np.array([[1, 1, 0, 1, 1, 1], [1, 1, 1, 0, 0, 0]], np.int32),
             "raw3d": (RNG.random((2, 6, 6)) > 0.3).astype(np.int32)}
    if mask != "none":
        masks["raw3d"][:, :, 0] = 1
        feeds["mask"] = masks[mask]
        inputs.append("mask")
    _check("Attention", feeds, _attention_weights(), ["y"], inputs=inputs, num_heads=4, atol=1e-5)


def test_attention_unidirectional_with_padding_and_a_scale() -> None:
    feeds = {"x": _f(2, 5, 16), "mask": np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], np.int32)}
    _check("Attention", feeds, _attention_weights(), ["y"], inputs=["x", "w", "b", "mask"], num_heads=2,
           unidirectional=1, scale=0.3)


def test_attention_unequal_value_width() -> None:
    consts = {"w": _f(16, 40) * 0.3, "b": _f(40) * 0.1}
    _check("Attention", {"x": _f(1, 4, 16)}, consts, ["y"], inputs=["x", "w", "b"], num_heads=2,
           qkv_hidden_sizes=[12, 12, 16])


@pytest.mark.parametrize("w_dtype", [np.uint8, np.int8])
def test_qattention(w_dtype: type) -> None:
    x = RNG.integers(0, 255, (2, 5, 16)).astype(np.uint8)
    lo, hi = (0, 255) if w_dtype is np.uint8 else (-127, 127)
    consts = {"w": RNG.integers(lo, hi, (16, 48)).astype(w_dtype), "b": _f(48) * 0.1,
              "xs": np.float32(0.02), "ws": np.float32(0.01), "xz": np.uint8(120), "wz": w_dtype(3)}
    feeds = {"x": x, "mask": np.array([5, 3], np.int32)}
    _check("QAttention", feeds, consts, ["y"], inputs=["x", "w", "b", "xs", "ws", "mask", "xz", "wz"], num_heads=4,
           atol=1e-4)


@pytest.mark.parametrize("interleaved, layout", [(False, "bsd"), (True, "bsd"), (False, "bnsh")])
def test_rotary_embedding(interleaved: bool, layout: str) -> None:
    x = _f(2, 5, 4 * 8) if layout == "bsd" else _f(2, 4, 5, 8)
    positions = np.array([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]], np.int64)
    angles = np.arange(12)[:, None] * (1.0 / 10000 ** (np.arange(4) / 4))[None, :]
    consts = {"cos": np.cos(angles).astype(np.float32), "sin": np.sin(angles).astype(np.float32)}
    extra = {"num_heads": 4} if layout == "bsd" else {}
    _check("RotaryEmbedding", {"x": x, "pos": positions}, consts, ["y"], inputs=["x", "pos", "cos", "sin"],
           interleaved=int(interleaved), **extra)


def test_group_query_attention_first_call() -> None:
    batch, seq, heads, kv_heads, head = 2, 5, 4, 2, 8
    feeds = {"q": _f(batch, seq, heads * head), "k": _f(batch, seq, kv_heads * head),
             "v": _f(batch, seq, kv_heads * head), "seqlens_k": np.array([4, 2], np.int32),
             "total": np.array(seq, np.int32)}
    _check("GroupQueryAttention", feeds, {}, ["y", "present_k", "present_v"],
           inputs=["q", "k", "v", "", "", "seqlens_k", "total"], num_heads=heads, kv_num_heads=kv_heads, atol=1e-5)


@pytest.mark.parametrize("b_dtype, per_column", [(np.uint8, False), (np.int8, True)])
def test_matmul_integer_to_float(b_dtype: type, per_column: bool) -> None:
    lo, hi = (0, 255) if b_dtype is np.uint8 else (-127, 127)
    consts = {"b": RNG.integers(lo, hi, (16, 6)).astype(b_dtype), "as": np.float32(0.03),
              "bs": (RNG.random(6).astype(np.float32) * 0.02 + 0.001) if per_column else np.float32(0.02),
              "az": np.uint8(128), "bz": b_dtype(2), "bias": _f(6)}
    feeds = {"a": RNG.integers(0, 255, (3, 4, 16)).astype(np.uint8)}
    _check("MatMulIntegerToFloat", feeds, consts, ["y"], inputs=["a", "b", "as", "bs", "az", "bz", "bias"])


@pytest.mark.parametrize("b_dtype", [np.int8, np.uint8])
def test_dynamic_quantize_matmul(b_dtype: type) -> None:
    lo, hi = (0, 255) if b_dtype is np.uint8 else (-127, 127)
    consts = {"b": RNG.integers(lo, hi, (16, 6)).astype(b_dtype), "bs": np.float32(0.02), "bz": b_dtype(1),
              "bias": _f(6)}
    _check("DynamicQuantizeMatMul", {"a": _f(3, 16)}, consts, ["y"], inputs=["a", "b", "bs", "bz", "bias"],
           atol=1e-4)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_add_and_global_average_pool(dtype: type) -> None:
    lo, hi = (-128, 127) if dtype is np.int8 else (0, 255)
    a = RNG.integers(lo, hi, (2, 3, 4, 5)).astype(dtype)
    b = RNG.integers(lo, hi, (2, 3, 4, 5)).astype(dtype)
    consts = {"as": np.float32(0.05), "az": dtype(3), "bs": np.float32(0.07), "bz": dtype(5),
              "ys": np.float32(0.09), "yz": dtype(2)}
    _check("QLinearAdd", {"a": a, "b": b}, consts, ["y"], inputs=["a", "as", "az", "b", "bs", "bz", "ys", "yz"])
    _check("QLinearAdd", {"a": a, "b": b[:1, :, :1]}, consts, ["y"],
           inputs=["a", "as", "az", "b", "bs", "bz", "ys", "yz"])
    _check("QLinearGlobalAveragePool", {"a": a}, {k: consts[k] for k in ("as", "az", "ys", "yz")}, ["y"],
           inputs=["a", "as", "az", "ys", "yz"], channels_last=0)


@pytest.mark.parametrize("quantized_output", [True, False])
def test_qgemm(quantized_output: bool) -> None:
    consts = {"as": np.float32(0.04), "az": np.int8(1), "b": RNG.integers(-127, 127, (6, 16)).astype(np.int8),
              "bs": np.float32(0.02), "bz": np.int8(0), "c": RNG.integers(-500, 500, 6).astype(np.int32)}
    inputs = ["a", "as", "az", "b", "bs", "bz", "c"]
    if quantized_output:
        consts.update({"ys": np.float32(0.3), "yz": np.int8(-3)})
        inputs += ["ys", "yz"]
    _check("QGemm", {"a": RNG.integers(-128, 127, (3, 16)).astype(np.int8)}, consts, ["y"], inputs=inputs, transB=1)


@pytest.mark.parametrize("direction, per_column", [("forward", False), ("bidirectional", True)])
def test_dynamic_quantize_lstm(direction: str, per_column: bool) -> None:
    """ORT's quantize_dynamic output for an LSTM: int8 weights stored [dir, input, 4H], activations quantized
    to uint8 at run time (the whole input once, the hidden state every step)."""
    dirs, hidden, size = (2 if direction == "bidirectional" else 1), 6, 5
    cols = (dirs, 4 * hidden) if per_column else (dirs,)
    consts = {"w": RNG.integers(-127, 127, (dirs, size, 4 * hidden)).astype(np.int8),
              "r": RNG.integers(-127, 127, (dirs, hidden, 4 * hidden)).astype(np.int8),
              "b": _f(dirs, 8 * hidden) * 0.1,
              "ws": (RNG.random(cols) * 0.01 + 0.002).astype(np.float32), "wz": np.zeros(cols, np.int8),
              "rs": (RNG.random(cols) * 0.01 + 0.002).astype(np.float32), "rz": np.zeros(cols, np.int8)}
    # A float LSTM on the dequantized weights is ~1e-2 away from ORT; quantizing the hidden state over the
    # whole batch instead of row by row, ~1e-3.
    got = _check("DynamicQuantizeLSTM", {"x": _f(7, 2, size)}, consts, ["y", "y_h", "y_c"],
                 inputs=["x", "w", "r", "b", "", "", "", "", "ws", "wz", "rs", "rz"], hidden_size=hidden,
                 direction=direction, atol=1e-5)
    assert got[0].shape == (7, dirs, 2, hidden)
