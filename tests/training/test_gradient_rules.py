"""Every op's gradient rule against float64 central finite differences, run by the oracle."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.ops.raster import check_regions
from edgerun.ir.region import Region
from edgerun.ir.registry import NoGradientError, OpKind, all_ops, gradient_rule, no_gradient_reason
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle.interpreter import interpret
from edgerun.passes.autodiff import append_gradients, gradient_graph
from tests.training.gradcheck import check_gradient, loss_graph

R = np.random.default_rng(0)
X = R.standard_normal((3, 4))
ROW = R.standard_normal((4,))
POS = R.uniform(0.5, 2.0, (3, 4))
IMG = R.standard_normal((2, 4, 7, 6))


def test_every_atomic_raster_and_structural_op_has_a_rule_or_says_why_not() -> None:
    kinds = (OpKind.ATOMIC, OpKind.RASTER, OpKind.CONTROL_FLOW, OpKind.DATA_DEPENDENT)
    missing = [op.name for op in all_ops() if op.kind in kinds and gradient_rule(op.name) is None
               and (no_gradient_reason(op.name) or "").startswith("no gradient rule")]
    assert missing == []
    assert gradient_rule("raster") is not None and gradient_rule("conv2d") is not None
    assert "comparison" in (no_gradient_reason("gt") or "")


def _unary(op: str) -> Any:
    return lambda b, n: b.unary(op, n[0])


def _binary(op: str, **attrs: Any) -> Any:
    return lambda b, n: b.emit(op, n, **attrs)


def _one(op: str, **attrs: Any) -> Any:
    return lambda b, n: b.emit(op, n, **attrs)


CASES: list[tuple[str, Any, list[np.ndarray]]] = [
    *[(op, _unary(op), [X]) for op in ("exp", "tanh", "sigmoid", "erf", "sin", "cos", "neg", "abs", "reciprocal")],
    *[(op, _unary(op), [POS]) for op in ("log", "sqrt", "rsqrt")],
    *[(op, _binary(op), [X, ROW + 3]) for op in ("add", "sub", "mul", "div", "maximum", "minimum", "mod")],
    ("fmod", _binary("mod", fmod=True), [X, ROW + 3]),
    ("pow", _binary("pow"), [POS, ROW]),
    *[(f"{op} {axes}", _one(op, axes=axes, keepdims=keep), [X])
      for op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min")
      for axes, keep in (([1], False), ([0], True), (None, False))],
    ("matmul broadcast", _binary("matmul"), [R.standard_normal((2, 3, 4)), R.standard_normal((4, 5))]),
    ("where", lambda b, n: b.emit("where", [b.binary("gt", n[0], n[1]), n[0], n[1]]), [X, ROW]),
    ("gather", lambda b, n: b.emit("gather", [n[0], b.const(np.array([[0, 2], [-1, 0]]), DType.int64)], axis=1),
     [X]),
    ("scatter_add repeated indices", lambda b, n: b.emit(
        "scatter_add", [n[0], b.const(np.array([[0, 3], [-1, 0]]), DType.int64), n[1]], axis=1),
     [X, R.standard_normal((3, 2, 2))]),
    ("update_slice", lambda b, n: b.emit("update_slice", [n[0], n[1], b.const(np.array([5]), DType.int64)]),
     [R.standard_normal((6, 3)), R.standard_normal((2, 3))]),
    ("softmax", _one("softmax", axis=1), [X]),
    ("log_softmax", _one("log_softmax", axis=0), [X]),
    ("relu", _one("relu"), [X]),
    ("clamp", _one("clamp", min=-0.5, max=0.5), [X]),
    ("gelu (its decomposition)", _one("gelu"), [X]),
    ("layer_norm", _one("layer_norm", normalized_ndim=1, eps=1e-5), [X, R.standard_normal(4), R.standard_normal(4)]),
    *[(f"conv2d {attrs}", _one("conv2d", **attrs),
       [IMG, R.standard_normal((4, 4 // attrs.get("groups", 1), 3, 2)), R.standard_normal(4)])
      for attrs in ({"padding": [1, 1, 1, 1]}, {"stride": [2, 2], "padding": [0, 1, 1, 0]},
                    {"dilation": [2, 1], "groups": 2, "stride": [1, 2]}, {"groups": 4, "padding": [1, 1, 1, 1]})],
    *[(f"{op} {attrs}", _one(op, **attrs), [IMG]) for op in ("max_pool2d", "avg_pool2d")
      for attrs in ({"kernel": [2, 2]}, {"kernel": [3, 3], "stride": [1, 1], "padding": [1, 1, 1, 1]},
                    {"kernel": [3, 2], "stride": [2, 2], "padding": [1, 1, 1, 1], "ceil_mode": True})],
    ("avg_pool2d without the padding", _one("avg_pool2d", kernel=[2, 2], stride=[2, 1], padding=[1, 1, 1, 1],
                                            count_include_pad=False), [IMG]),
    ("max_pool2d dilated", _one("max_pool2d", kernel=[3, 3], dilation=[2, 1], stride=[1, 1]), [IMG]),
    ("max_pool2d whose windows tile the input", _one("max_pool2d", kernel=[2, 3]), [R.standard_normal((2, 4, 6, 6))]),
    ("avg_pool2d whose windows tile the input", _one("avg_pool2d", kernel=[3, 2]), [R.standard_normal((2, 4, 6, 6))]),
    ("conv2d stride 1 (weight cotangent as one matmul)", _one("conv2d", padding=[2, 0, 1, 1], dilation=[1, 2]),
     [IMG, R.standard_normal((3, 4, 3, 2)), R.standard_normal(3)]),
    ("transpose", _one("transpose", perm=[2, 0, 3, 1]), [IMG]),
    ("expand", _one("expand", shape=[3, 4, 5]), [R.standard_normal((4, 1))]),
    ("pad reflect", _one("pad", pads=[[1, 2], [2, 1]], mode="reflect"), [R.standard_normal((4, 5))]),
    ("concat of one value twice", lambda b, n: b.emit("concat", [n[0], n[1], n[0]], axis=1),
     [R.standard_normal((2, 3)), R.standard_normal((2, 2))]),
    ("slice with negative steps", _one("slice", starts=[5, 0], ends=[0, 4], steps=[-2, 3], axes=[0, 1]),
     [R.standard_normal((7, 5))]),
]


@pytest.mark.parametrize("emit,inputs", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rule_matches_finite_differences(emit: Any, inputs: list[np.ndarray]) -> None:
    check_gradient(emit, inputs, directions=2)


def test_relu_and_clamp_pass_no_gradient_at_a_bound_as_torch_does() -> None:
    # A ReLU6 over a window of zeros sees exactly 0; maximum/minimum alone would split the gradient there.
    x = np.array([[-1.0, 0.0, 3.0, 6.0, 7.0]])
    for op, attrs, want in (("relu", {}, [0, 0, 1, 1, 1]), ("clamp", {"min": 0.0, "max": 6.0}, [0, 0, 1, 0, 0])):
        g = loss_graph(lambda b, n, op=op, attrs=attrs: b.emit(op, n, **attrs), [x])
        weights = next(a for a in g.constants.values() if a.shape == x.shape)
        grad = interpret(gradient_graph(g, g.outputs[0], ["x0"]), [x])[1]
        np.testing.assert_array_equal(grad, weights * np.array([want]))


def test_cast_passes_the_gradient_back_in_the_input_type() -> None:
    check_gradient(lambda b, n: b.emit("cast", [b.emit("cast", n, dtype="float32")], dtype="float64"), [X],
                   eps=1e-3, rtol=1e-3)


@st.composite
def _rasters(draw: Any) -> tuple[list[np.ndarray], list[list[int]], list[int], float | None]:
    """Random regions over one or two sources: any strides, 0 included, so sources may be read repeatedly
    (expand, sliding windows) and output elements written by several regions (the last region wins)."""
    sizes = [draw(st.integers(1, 12)) for _ in range(draw(st.integers(1, 2)))]
    out = draw(st.integers(1, 12))
    regions = []
    for _ in range(draw(st.integers(1, 3))):
        src = draw(st.integers(0, len(sizes) - 1))
        size = [draw(st.integers(1, 3)) for _ in range(3)]
        ss = [draw(st.integers(-2, 3)) for _ in range(3)]
        ds = [draw(st.integers(-2, 3)) for _ in range(3)]
        region = Region(src, 0, (ss[0], ss[1], ss[2]), 0, (ds[0], ds[1], ds[2]), (size[0], size[1], size[2]))
        lo, hi = region.extent("src")
        dlo, dhi = region.extent("dst")
        so = draw(st.integers(-lo, max(-lo, sizes[src] - 1 - hi)))
        do = draw(st.integers(-dlo, max(-dlo, out - 1 - dhi)))
        regions.append(Region(src, so, region.src_strides, do, region.dst_strides, region.size).to_list())
    fill = draw(st.sampled_from([0.25, None]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return [rng.standard_normal(n) for n in sizes], regions, [out], fill


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_rasters())
def test_raster_transpose_matches_finite_differences(case: Any) -> None:
    sources, regions, shape, fill = case
    try:
        check_regions(regions, [s.size for s in sources], int(np.prod(shape)))
    except ValueError:
        return  # a region the offsets could not fit inside its source or the output
    for stored in regions:
        dst, _ = Region.of(stored).index_grids()
        if np.unique(dst).size != dst.size:
            return  # one region writing an element twice: which write wins is the kernel's copy order
    if fill is None:  # the regions must then cover the output
        covered = np.zeros(shape[0], bool)
        for r in regions:
            covered[Region.of(r).index_grids()[0]] = True
        if not covered.all():
            fill = 0.0
    check_gradient(lambda b, n: b.emit("raster", n, shape=shape, fill=fill, regions=regions), sources)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.integers(1, 3), min_size=0, max_size=3), st.lists(st.booleans(), min_size=3, max_size=3),
       st.sampled_from(["add", "sub", "mul", "div", "maximum"]))
def test_broadcast_binary_gradients_are_summed_back_to_each_operand(shape: list[int], ones: list[bool],
                                                                     op: str) -> None:
    other = [1 if one else d for d, one in zip(shape, ones)][len(shape) // 2:]
    rng = np.random.default_rng(len(shape))
    check_gradient(lambda b, n: b.binary(op, n[0], n[1]),
                   [rng.standard_normal(shape), rng.standard_normal(other) + 3.0])


def _graph(x_dtype: DType = DType.float32) -> tuple[Graph, Builder, str]:
    g = Graph()
    b = Builder(g)
    return g, b, g.add_input("x", TensorSpec((2, 3), x_dtype))


def test_a_path_through_an_op_without_gradient_names_the_node() -> None:
    g, b, x = _graph()
    scale = b.const(np.float32(0.5))
    q = b.emit("quantize_linear", [x, scale, b.const(np.int8(0))])
    y = b.emit("dequantize_linear", [q, scale, b.const(np.int8(0))])
    loss = b.emit("reduce_sum", [y])
    node = g.nodes[-2].name
    with pytest.raises(NoGradientError, match=f"node '{node}' \\(dequantize_linear\\).*quantized"):
        append_gradients(g, loss, [scale])


def test_integer_paths_carry_no_gradient_and_bad_requests_are_refused() -> None:
    g, b, x = _graph()
    index = b.emit("argmax", [x], axis=1)  # an index: the path ends here, as in torch
    loss = b.emit("reduce_sum", [b.binary("add", b.emit("cast", [index], dtype="float32"), b.const(np.float32(1)))])
    grads = append_gradients(g, loss, [x])
    assert g.specs[grads[x]] == g.specs[x]
    with pytest.raises(Exception, match="float scalar"):
        append_gradients(g, x, [x])
    with pytest.raises(Exception, match="no such value"):
        append_gradients(g, loss, ["nope"])
    gi, bi, xi = _graph(DType.int32)
    li = bi.emit("reduce_sum", [bi.emit("cast", [xi], dtype="float32")])
    with pytest.raises(Exception, match="not a float tensor"):
        append_gradients(gi, li, [xi])


@pytest.mark.parametrize("kernel,shape", [([2, 2], (2, 3, 8, 6)), ([2, 3], (2, 2, 4, 9)), ([4, 4], (1, 2, 8, 4))])
def test_max_pool_over_tiling_windows_sends_ties_to_the_first_tap_as_torch_does(kernel: list[int],
                                                                               shape: tuple[int, ...]) -> None:
    # Zeros and ones: most windows hold their max more than once (a max pool after a ReLU sees such windows).
    import torch

    from edgerun.backends.onnxruntime import create_backend
    from edgerun.passes.pipeline import optimize

    x = R.integers(0, 2, shape).astype(np.float32)
    g = Graph()
    b = Builder(g)
    xi = g.add_input("x", TensorSpec(shape, DType.float32))
    y = b.emit("max_pool2d", [xi], kernel=kernel)
    weights = R.standard_normal(b.shape(y)).astype(np.float32)
    g.outputs = [b.emit("reduce_sum", [b.binary("mul", y, b.const(weights))])]
    grad_graph = gradient_graph(g, g.outputs[0], ["x"])
    ops = {n.op for n in grad_graph.nodes}
    assert "resize" in ops and "reduce_min" not in ops  # the tiled rule, not one window per tap
    xt = torch.tensor(x, requires_grad=True)
    (torch.nn.functional.max_pool2d(xt, kernel) * torch.tensor(weights)).sum().backward()
    want = xt.grad.numpy()
    np.testing.assert_array_equal(interpret(grad_graph, [x])[1], want)
    np.testing.assert_array_equal(create_backend(threads=1).compile(optimize(grad_graph)[0])(x)[1], want)


def test_a_matrix_shared_by_every_batch_gets_its_gradient_from_one_product_over_all_rows() -> None:
    a, w = R.standard_normal((4, 5, 6)), R.standard_normal((6, 3))
    g = loss_graph(lambda b, n: b.emit("matmul", n), [a, w])
    grad_graph = gradient_graph(g, g.outputs[0], ["x1"])
    products = [n for n in grad_graph.nodes if n.op == "matmul" and "gradient_of" in n.meta]
    assert [grad_graph.specs[n.outputs[0]].shape for n in products] == [(6, 3)]  # not [4, 6, 3], then a sum
    assert not any(n.op == "reduce_sum" and "gradient_of" in n.meta for n in grad_graph.nodes)
    check_gradient(lambda b, n: b.emit("matmul", n), [a, w], wrt=[1])
