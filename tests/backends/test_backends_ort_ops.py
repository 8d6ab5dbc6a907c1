"""The ONNX Runtime delegate op by op: every atomic op it claims, in every claimed dtype, against reference."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from backends_testkit import assert_matches_reference, one_node_graph, run_on

from edgerun.backends.onnxruntime import OnnxRuntimeBackend
from edgerun.backends.onnxruntime.onnx_ops import COMPOSITES, SUPPORTED, TRANSLATORS

ORT = OnnxRuntimeBackend(threads=1)
RNG = np.random.default_rng(0)


def f32(*shape: int, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def ints(dtype: type, *shape: int, low: int = -9, high: int = 10) -> np.ndarray:
    return RNG.integers(low, high, shape).astype(dtype)


def boolean(*shape: int) -> np.ndarray:
    return RNG.random(shape) > 0.5


POSITIVE = {"log", "sqrt", "rsqrt"}
UNARY_FLOAT = ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "floor", "ceil", "round",
               "reciprocal"]
NUMERIC_BINARY = ["add", "sub", "mul", "maximum", "minimum"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]
REDUCE = ["reduce_sum", "reduce_max", "reduce_min"]

CASES: list[tuple[str, str, list[np.ndarray], dict[str, Any]]] = []
for _op in UNARY_FLOAT:
    _x = f32(3, 5, low=0.1) if _op in POSITIVE else f32(3, 5)
    if _op == "round":
        _x = np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.4, -0.6], np.float32)
    CASES.append((_op, _op, [_x], {}))
for _dt in (np.int32, np.int64):
    for _op in ("neg", "abs", "sign"):
        CASES.append((f"{_op}-{_dt.__name__}", _op, [ints(_dt, 4, 3)], {}))
    for _op in NUMERIC_BINARY:
        CASES.append((f"{_op}-{_dt.__name__}", _op, [ints(_dt, 3, 1, 4), ints(_dt, 5, 4)], {}))
    for _op in COMPARE:
        CASES.append((f"{_op}-{_dt.__name__}", _op, [ints(_dt, 2, 6, low=-2, high=3), ints(_dt, 6, low=-2, high=3)], {}))
    for _op in REDUCE:
        CASES.append((f"{_op}-{_dt.__name__}", _op, [ints(_dt, 3, 4, 5)], {"axes": [1], "keepdims": True}))
    CASES.append((f"argmax-{_dt.__name__}", "argmax", [ints(_dt, 4, 6, low=0, high=3)], {"axis": 1}))
for _op in ("neg", "abs", "sign"):
    CASES.append((_op, _op, [f32(4, 3)], {}))
for _op in [*NUMERIC_BINARY, "pow"]:
    CASES.append((_op, _op, [f32(3, 1, 4, low=0.2), f32(5, 4)], {}))
for _op in COMPARE:
    CASES.append((_op, _op, [np.round(f32(2, 6)), np.round(f32(6))], {}))
for _op in ("logical_and", "logical_or", "logical_xor"):
    CASES.append((_op, _op, [boolean(3, 4), boolean(4)], {}))
CASES += [
    ("logical_not", "logical_not", [boolean(5)], {}),
    ("div", "div", [f32(4, 5), f32(5, low=0.5)], {}),
    ("div-floor", "div", [f32(4, 5), f32(5, low=0.5) * np.where(RNG.random(5) > 0.5, 1, -1).astype(np.float32)],
     {"rounding": "floor"}),
    ("div-trunc", "div", [f32(4, 5), f32(5, low=0.5) * np.where(RNG.random(5) > 0.5, 1, -1).astype(np.float32)],
     {"rounding": "trunc"}),
    ("mod-fmod", "mod", [f32(4, 5), f32(5, low=0.5)], {"fmod": True}),
    ("where", "where", [boolean(3, 4), f32(3, 4), f32(4)], {}),
    ("where-int64", "where", [boolean(3, 4), ints(np.int64, 3, 4), ints(np.int64, 1)], {}),
    ("where-int32", "where", [boolean(3, 4), ints(np.int32, 3, 4), ints(np.int32, 4)], {}),
    ("cast-int32-float32", "cast", [ints(np.int32, 6)], {"dtype": "float32"}),
    ("cast-bool-float32", "cast", [boolean(6)], {"dtype": "float32"}),
    ("cast-int64-int32", "cast", [ints(np.int64, 6)], {"dtype": "int32"}),
    ("cast-int64-bool", "cast", [ints(np.int64, 6)], {"dtype": "bool"}),
    ("cast-float32-float16", "cast", [f32(6)], {"dtype": "float16"}),
    ("reduce_sum-all", "reduce_sum", [f32(3, 4, 5)], {}),
    ("reduce_mean", "reduce_mean", [f32(3, 4, 5)], {"axes": [-1, 0]}),
    ("reduce_mean-spatial-keep", "reduce_mean", [f32(2, 3, 4, 5)], {"axes": [2, 3], "keepdims": True}),
    ("reduce_mean-spatial", "reduce_mean", [f32(2, 3, 4, 5)], {"axes": [-1, 2], "keepdims": False}),
    ("reduce_max", "reduce_max", [f32(3, 4, 5)], {"axes": [2], "keepdims": False}),
    ("reduce_min-keep", "reduce_min", [f32(3, 4, 5)], {"axes": [0, 2], "keepdims": True}),
    ("argmax-last", "argmax", [np.array([[1, 3, 3, 0], [2, 2, 1, 2]], np.float32)],
     {"axis": -1, "select_last_index": True, "keepdims": True}),
    ("argmin", "argmin", [f32(4, 6)], {"axis": 0}),
    ("matmul-batched", "matmul", [f32(2, 1, 3, 4), f32(5, 4, 6)], {}),
    ("conv2d-asym-pads", "conv2d", [f32(1, 3, 9, 8), f32(4, 3, 3, 3), f32(4)],
     {"padding": [1, 0, 2, 1], "stride": [2, 1]}),
    ("conv2d-groups-dilation", "conv2d", [f32(2, 4, 10, 10), f32(6, 2, 3, 3)],
     {"padding": [2, 2, 2, 2], "dilation": [2, 2], "groups": 2}),
    ("conv2d-depthwise", "conv2d", [f32(1, 8, 7, 7), f32(8, 1, 3, 3), f32(8)],
     {"padding": [1, 1, 1, 1], "groups": 8}),
    ("max_pool2d-ceil", "max_pool2d", [f32(1, 2, 9, 9)],
     {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1, 1, 1], "ceil_mode": True}),
    ("max_pool2d-dilation", "max_pool2d", [f32(1, 2, 9, 9)], {"kernel": [2, 2], "dilation": [2, 2]}),
    ("avg_pool2d-include-pad", "avg_pool2d", [f32(1, 2, 8, 8)],
     {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1, 1, 1], "count_include_pad": True}),
    ("avg_pool2d-exclude-pad", "avg_pool2d", [f32(1, 2, 8, 8)],
     {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1, 1, 1], "count_include_pad": False}),
    ("avg_pool2d-ceil", "avg_pool2d", [f32(1, 2, 8, 8)],
     {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1, 1, 1], "ceil_mode": True,
      "count_include_pad": False}),
    ("gather-negative", "gather", [f32(4, 6, 3), np.array([[0, -1], [5, 2]], np.int64)], {"axis": 1}),
    ("gather-int32-idx", "gather", [ints(np.int64, 7, 3), np.array([6, 0, -7], np.int32)], {"axis": 0}),
    ("scatter_add-rows", "scatter_add", [f32(6, 3), np.array([[0, 5], [-1, 0], [2, 0]], np.int64), f32(3, 2, 3)],
     {"axis": 0}),
    ("scatter_add-middle-int32-idx", "scatter_add", [f32(2, 5, 3), np.array([4, -1, 0, 4], np.int32), f32(2, 4, 3)],
     {"axis": 1}),
    ("scatter_add-last-int64", "scatter_add", [ints(np.int64, 3, 4), np.array([3, 3, 0]), ints(np.int64, 3, 3)],
     {"axis": -1}),
    ("scatter_add-int32", "scatter_add", [ints(np.int32, 5), np.array([1, 1, 1, 4]), ints(np.int32, 4)], {}),
    ("scatter_add-float64", "scatter_add", [RNG.standard_normal((4, 2)), np.array([0, 0, 3]),
                                            RNG.standard_normal((3, 2))], {}),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_matches_reference(case: tuple[str, str, list[np.ndarray], dict[str, Any]]) -> None:
    _, op, inputs, attrs = case
    graph = one_node_graph(op, inputs, **attrs)
    assert ORT.supports(graph.nodes[0], graph), f"the delegate should claim {op} here"
    assert_matches_reference(graph, inputs, run_on(ORT, graph, inputs), rtol=2e-5, atol=2e-6)


def test_every_claimed_op_has_a_case() -> None:
    covered = {c[1] for c in CASES}
    assert set(SUPPORTED) - covered == set()


def test_weights_as_constants_are_bound_without_serialising() -> None:
    x, w = f32(1, 16, 12, 12), f32(32, 16, 3, 3)
    graph = one_node_graph("conv2d", [x, w], constant=[False, True], padding=[1, 1, 1, 1])
    compiled = ORT.compile(graph)
    # The weight goes to ORT as an OrtValue over our array: the serialised model holds no weight bytes.
    from edgerun.backends.onnxruntime import build_model

    model, external = build_model(graph)
    assert list(external) == [graph.nodes[0].inputs[1]]
    assert model.ByteSize() < w.nbytes / 10
    assert_matches_reference(graph, [x], compiled(x), rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("axes, keepdims, emitted", [([2, 3], True, ["GlobalAveragePool"]),
                                                      ([3, 2], False, ["GlobalAveragePool", "Reshape"]),
                                                      ([1, 2, 3], True, ["ReduceMean"]),
                                                      ([3], True, ["ReduceMean"])])
def test_spatial_mean_is_global_average_pool(axes: list[int], keepdims: bool, emitted: list[str]) -> None:
    # ORT keeps GlobalAveragePool in its blocked conv layout; a ReduceMean after the last conv costs a
    # reorder back to NCHW first (SqueezeNet's head, docs/benchmarks.md).
    from edgerun.backends.onnxruntime import build_model

    graph = one_node_graph("reduce_mean", [f32(1, 8, 5, 5)], axes=axes, keepdims=keepdims)
    model, _ = build_model(graph)
    assert [n.op_type for n in model.graph.node] == emitted


def test_unclaimed_edge_cases_stay_on_reference() -> None:
    # float -> int casts (NaN, saturation) and Python-style float modulo have no exact ONNX twin.
    cast = one_node_graph("cast", [f32(3)], dtype="int32")
    mod = one_node_graph("mod", [f32(3), f32(3, low=0.5)])
    idiv = one_node_graph("div", [ints(np.int32, 3), ints(np.int32, 3, low=1)])
    for graph in (cast, mod, idiv):
        assert not ORT.supports(graph.nodes[0], graph)


def test_io_binding_writes_into_the_callers_arrays() -> None:
    x = f32(2, 8)
    graph = one_node_graph("tanh", [x])
    compiled = ORT.compile(graph)
    out = np.empty((2, 8), np.float32)
    inputs, outputs = [x], [out]
    compiled.run(inputs, outputs)
    np.testing.assert_allclose(out, np.tanh(x), rtol=1e-6)
    x[...] = 0.5  # same arrays, new contents: the binding is reused and reads the new values
    compiled.run(inputs, outputs)
    np.testing.assert_allclose(out, np.tanh(np.float32(0.5)), rtol=1e-6)
    strided = np.empty((2, 16), np.float32)[:, ::2]  # not contiguous: goes through a staging buffer
    compiled.run([x], [strided])
    np.testing.assert_allclose(strided, np.tanh(np.float32(0.5)), rtol=1e-6)


COMPOSITE_CASES: list[tuple[str, str, list[np.ndarray], dict[str, Any], str]] = [
    ("relu", "relu", [f32(2, 8, low=-8, high=8)], {}, "Relu"),
    ("clamp-both", "clamp", [f32(2, 8, low=-8, high=8)], {"min": 0.0, "max": 6.0}, "Clip"),
    ("clamp-max-only", "clamp", [f32(2, 8, low=-8, high=8)], {"min": None, "max": 1.5}, "Clip"),
    ("gelu", "gelu", [f32(3, 7, low=-6, high=6)], {}, "Gelu"),
    ("gelu-tanh", "gelu", [f32(3, 7, low=-6, high=6)], {"approximate": "tanh"}, "Gelu"),
    ("softmax-last", "softmax", [f32(2, 5, 7, low=-20, high=20)], {"axis": -1}, "Softmax"),
    ("softmax-middle", "softmax", [f32(2, 5, 7, low=-20, high=20)], {"axis": 1}, "Softmax"),
    ("layer_norm", "layer_norm", [f32(2, 6, 16) * 3 + 1, f32(16), f32(16)], {"normalized_ndim": 1, "eps": 1e-5},
     "LayerNormalization"),
    ("layer_norm-2d-no-affine", "layer_norm", [f32(2, 6, 16) * 3 + 1], {"normalized_ndim": 2},
     "LayerNormalization"),
    ("rms_norm", "rms_norm", [f32(5, 576) * 3 + 1, f32(576)], {"eps": 1e-5}, "SimplifiedLayerNormalization"),
    ("rms_norm-2d-no-weight", "rms_norm", [f32(2, 6, 16)], {"normalized_ndim": 2},
     "SimplifiedLayerNormalization"),
    ("resize-nearest-2x", "resize", [f32(1, 3, 5, 7)],
     {"mode": "nearest", "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor",
      "scales": [1.0, 1.0, 2.0, 2.0], "shape": [1, 3, 10, 14]}, "Resize"),
    ("resize-nearest-down", "resize", [f32(1, 3, 8, 9)],
     {"mode": "nearest", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_ceil",
      "scales": [1.0, 1.0, 0.5, 1.0 / 3.0], "shape": [1, 3, 4, 3]}, "Resize"),
    ("resize-linear-sizes", "resize", [f32(1, 2, 5, 7)],
     {"mode": "linear", "coordinate_transformation_mode": "half_pixel", "nearest_mode": "round_prefer_floor",
      "scales": [1.0, 1.0, 8 / 5, 10 / 7], "shape": [1, 2, 8, 10]}, "Resize"),
    ("resize-linear-align", "resize", [f32(2, 6, 4)],
     {"mode": "linear", "coordinate_transformation_mode": "align_corners", "nearest_mode": "round_prefer_floor",
      "scales": [1.0, 1.5, 2.0], "shape": [2, 9, 8]}, "Resize"),
    ("conv_transpose-upsample", "conv_transpose2d", [f32(1, 4, 6, 5), f32(4, 3, 2, 2), f32(3)],
     {"stride": [2, 2], "padding": [0, 0, 0, 0]}, "ConvTranspose"),
    ("conv_transpose-pads-groups", "conv_transpose2d", [f32(2, 4, 5, 6), f32(4, 3, 3, 2)],
     {"stride": [2, 3], "dilation": [1, 2], "padding": [1, 0, 2, 1], "output_padding": [1, 2], "groups": 2},
     "ConvTranspose"),
]


@pytest.mark.parametrize("case", COMPOSITE_CASES, ids=[c[0] for c in COMPOSITE_CASES])
def test_claimed_composite_is_one_onnx_node_matching_its_decomposition(
        case: tuple[str, str, list[np.ndarray], dict[str, Any], str]) -> None:
    from edgerun.backends.onnxruntime import build_model
    from edgerun.oracle import interpret

    _, op, inputs, attrs, onnx_op = case
    graph = one_node_graph(op, inputs, constant=[False] + [True] * (len(inputs) - 1), **attrs)
    assert ORT.keeps_whole(graph.nodes[0], graph), f"the delegate should keep {op} whole here"
    model, _ = build_model(graph)
    assert [n.op_type for n in model.graph.node] == [onnx_op]
    got = run_on(ORT, graph, inputs[:1])
    np.testing.assert_allclose(got[0], interpret(graph, inputs[:1])[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("window", "softcap"), [(0, 0.0), (4, 2.0)])
def test_cache_attention_is_one_group_query_attention_matching_its_decomposition(window: int,
                                                                                 softcap: float) -> None:
    """cache_attention (several outputs: the attention and both caches) is claimed whole and becomes one
    GroupQueryAttention (plus the index arithmetic feeding it); its output and the caches with the new rows
    equal the reference's decomposition, with and without a sliding window and soft-capping (Gemma's)."""
    from edgerun.backends.onnxruntime import build_model
    from edgerun.ir.builder import Builder
    from edgerun.ir.graph import Graph
    from edgerun.ir.tensor_spec import TensorSpec
    from edgerun.oracle import interpret

    steps, context, heads, kv_heads, head_dim = 3, 10, 4, 2, 16  # GroupQueryAttention needs head_dim % 16 == 0
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((steps, n * head_dim)).astype(np.float32) for n in (heads, kv_heads, kv_heads))
    k_cache, v_cache = rng.standard_normal((2, 1, kv_heads, context, head_dim)).astype(np.float32)
    angles = np.arange(context, dtype=np.float32)[:, None] * rng.uniform(0.1, 1, head_dim // 2).astype(np.float32)
    cos, sin = (np.concatenate([f(angles)] * 2, axis=1).astype(np.float32) for f in (np.cos, np.sin))
    g = Graph()
    names = [g.add_input(n, TensorSpec(a.shape, "float32")) for n, a in
             (("q", q), ("k", k), ("v", v), ("kc", k_cache), ("vc", v_cache))]
    start = g.add_input("start", TensorSpec((1,), "int64"))
    tables = [g.add_constant(cos, name="cos"), g.add_constant(sin, name="sin")]
    g.outputs = Builder(g).emit_multi("cache_attention", [*names, start, *tables], head_dim=head_dim,
                                      layout="heads", scale=head_dim ** -0.5, window=window, softcap=softcap)
    assert ORT.keeps_whole(g.nodes[0], g)
    model, _ = build_model(g)
    assert [n.op_type for n in model.graph.node].count("GroupQueryAttention") == 1
    feeds = [q, k, v, k_cache, v_cache, np.array([5])]
    want = interpret(g, [a.copy() for a in feeds])
    got = run_on(ORT, g, [a.copy() for a in feeds])
    assert len(got) == len(want) == 3
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_the_backend_declares_the_decoder_ops_without_changing_other_tables() -> None:
    """The decoder's ops reach the backend through the tables it joins (OnnxRuntimeBackend.composites, the
    emitter's TRANSLATORS_ALL), not by importing onnx_llm_ops writing into onnx_ops' tables; what compile
    declares (the inputs GroupQueryAttention appends to) comes back from the emitter, not from ONNX metadata."""
    from edgerun.backends.onnxruntime import emit_partition
    from edgerun.backends.onnxruntime.onnx_control_flow import TRANSLATORS_ALL
    from edgerun.backends.onnxruntime.onnx_llm_ops import LLM_COMPOSITES, LLM_TRANSLATORS

    assert not set(LLM_TRANSLATORS) & set(TRANSLATORS) and not set(LLM_COMPOSITES) & set(COMPOSITES)
    assert set(LLM_COMPOSITES) <= set(ORT.composites) and set(LLM_TRANSLATORS) <= set(TRANSLATORS_ALL)
    graph = one_node_graph("rms_norm", [f32(2, 16), f32(16)], constant=[False, True], normalized_ndim=1)
    emitted = emit_partition(graph)
    assert [n.op_type for n in emitted.model.graph.node] == ["SimplifiedLayerNormalization"]
    assert emitted.overwrites == {} and emitted.fused_attentions == 0 and not emitted.model.metadata_props


@pytest.mark.parametrize(("steps", "window"), [(1, 0), (2, 4)])
def test_cache_attention_over_sequences_is_one_group_query_attention(steps: int, window: int) -> None:
    """Several sequences at their own starts, one row each (a batched decode): one GroupQueryAttention over
    the batch with per-sequence seqlens_k; two rows each, which ORT's kernel refuses after a past: the
    decomposition. Both equal the reference's decomposition (outputs and caches)."""
    from edgerun.backends.onnxruntime import build_model
    from edgerun.ir.builder import Builder
    from edgerun.ir.graph import Graph
    from edgerun.ir.tensor_spec import TensorSpec
    from edgerun.oracle import interpret

    starts, context, heads, kv_heads, head_dim = np.array([0, 7, 3, 10 - steps]), 10, 4, 2, 16
    batch = len(starts)
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((batch * steps, n * head_dim)).astype(np.float32)
               for n in (heads, kv_heads, kv_heads))
    k_cache, v_cache = rng.standard_normal((2, batch, kv_heads, context, head_dim)).astype(np.float32)
    angles = np.arange(context, dtype=np.float32)[:, None] * rng.uniform(0.1, 1, head_dim // 2).astype(np.float32)
    cos, sin = (np.concatenate([f(angles)] * 2, axis=1).astype(np.float32) for f in (np.cos, np.sin))
    g = Graph()
    names = [g.add_input(n, TensorSpec(a.shape, "float32")) for n, a in
             (("q", q), ("k", k), ("v", v), ("kc", k_cache), ("vc", v_cache))]
    start = g.add_input("start", TensorSpec((batch,), "int64"))
    tables = [g.add_constant(cos, name="cos"), g.add_constant(sin, name="sin")]
    g.outputs = Builder(g).emit_multi("cache_attention", [*names, start, *tables], head_dim=head_dim,
                                      layout="heads", scale=head_dim ** -0.5, window=window)
    assert ORT.keeps_whole(g.nodes[0], g)
    model, _ = build_model(g)
    assert [n.op_type for n in model.graph.node].count("GroupQueryAttention") == (steps == 1)
    feeds = [q, k, v, k_cache, v_cache, starts]
    want = interpret(g, [a.copy() for a in feeds])
    got = run_on(ORT, g, [a.copy() for a in feeds])
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)


def test_every_claimed_composite_has_a_case() -> None:
    # cache_attention has several outputs and state, so its case is the test above rather than a table row.
    assert set(ORT.composites) - {c[1] for c in COMPOSITE_CASES} == {"cache_attention"}


def test_layer_norm_with_broadcast_weights_is_not_claimed() -> None:
    graph = one_node_graph("layer_norm", [f32(2, 6, 16), f32(1)], constant=[False, True], normalized_ndim=1)
    assert not ORT.keeps_whole(graph.nodes[0], graph)


def test_rms_norm_with_broadcast_weight_is_not_claimed() -> None:
    # SimplifiedLayerNormalization's scale is shaped like the normalised axes; a broadcast one stays decomposed.
    graph = one_node_graph("rms_norm", [f32(2, 6, 16), f32(1)], constant=[False, True], normalized_ndim=1)
    assert not ORT.keeps_whole(graph.nodes[0], graph)


def test_sessions_use_large_constants_in_place_and_copy_those_constant_folding_reads() -> None:
    """make_session shares the program's arrays with ORT (add_initializer: no copy per session); a constant
    only constant-folded nodes read (here a Transpose of a weight) is copied in, since ORT's folding reads its
    bytes from the graph; the results are those of numpy either way."""
    from onnx import TensorProto, helper

    from edgerun.backends.onnxruntime import _external_placeholder, make_session
    from edgerun.backends.onnxruntime.onnx_prepacked import shared_initializers

    w, w2 = f32(64, 32), f32(32, 64)
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "wt"], ["y"]),
         helper.make_node("MatMul", ["x", "w2"], ["y2"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64]),
         helper.make_tensor_value_info("y2", TensorProto.FLOAT, [2, 64])],
        [_external_placeholder("w", w), _external_placeholder("w2", w2)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    session = make_session(model, {"w": w, "w2": w2}, threads=1)
    assert shared_initializers(session) == {"w2"}
    x = f32(2, 32)
    y, y2 = session.run(None, {"x": x})
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(y2, x @ w2, rtol=1e-5, atol=1e-5)


def test_sessions_copy_in_conv_weights_alone_and_share_every_other_large_constant() -> None:
    """ORT's NCHWc layout transformer reads a Conv weight's bytes from the graph: that one is copied in, and
    the MatMul weight beside it stays shared (copying every initializer after a failed attempt kept every
    weight resident twice). The session computes what numpy does."""
    from onnx import TensorProto, helper

    from edgerun.backends.onnxruntime import _external_placeholder, _initializer_read, make_session
    from edgerun.backends.onnxruntime.onnx_prepacked import shared_initializers

    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
    m = rng.standard_normal((32, 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Reshape", ["c", "shape"], ["r"]), helper.make_node("MatMul", ["r", "m"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 8, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 64])],
        [_external_placeholder("w", w), _external_placeholder("m", m),
         helper.make_tensor("shape", TensorProto.INT64, [2], [16, 32])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    session = make_session(model, {"w": w, "m": m}, threads=1)
    assert shared_initializers(session) == {"m"}
    x = rng.standard_normal((1, 8, 8, 4)).astype(np.float32)
    import torch

    conv = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w), padding=1).numpy()
    np.testing.assert_allclose(session.run(None, {"x": x})[0], conv.reshape(16, 32) @ m, rtol=1e-4, atol=1e-4)
    message = ("tensorprotoutils.cc:2201 GetExtDataFromTensorProto External initializer: w_2 offset: 0 size to "
               "read: 589824 given file_length: 0 are out of bounds or can not be read in full.")
    assert _initializer_read(message) == "w_2" and _initializer_read("some other failure") is None
