"""Atomic ops: shape rules, reference kernels against numpy/torch, and clear errors on bad graphs."""

from __future__ import annotations

import numpy as np
import pytest
from numpy_only import lazy

from edgerun.errors import EdgerunError, VerificationError
from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.registry import OpKind, all_ops, infer_specs
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.ir.verifier import verify
from edgerun.oracle import KERNELS, interpret

# The outside oracles, imported by the tests that use them (the others run in the numpy-only tier).
torch = lazy("torch")
F = lazy("torch.nn.functional")


def _graph(op: str, specs: list[TensorSpec], **attrs: object) -> Graph:
    g = Graph()
    ins = [g.add_input(f"x{i}", s) for i, s in enumerate(specs)]
    g.outputs = Builder(g).emit_multi(op, ins, **attrs)
    verify(g)
    return g


def test_every_atomic_op_and_raster_has_a_reference_kernel_and_a_reason() -> None:
    for op in all_ops(OpKind.ATOMIC) + all_ops(OpKind.RASTER):
        assert op.name in KERNELS, op.name
        assert op.doc, f"{op.name} must say why it is in the atomic set"


UNARY = {
    "exp": np.exp, "log": np.log, "sqrt": np.sqrt, "tanh": np.tanh, "sin": np.sin, "cos": np.cos,
    "floor": np.floor, "ceil": np.ceil, "round": np.round, "neg": np.negative, "abs": np.abs,
    "sign": np.sign, "reciprocal": np.reciprocal, "rsqrt": lambda x: 1 / np.sqrt(x),
    "sigmoid": lambda x: torch.sigmoid(torch.from_numpy(x)).numpy(),
    "erf": lambda x: torch.erf(torch.from_numpy(x)).numpy(),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op: str) -> None:
    x = np.linspace(0.1 if op in ("log", "sqrt", "rsqrt") else -60, 60, 257, dtype=np.float32)
    (got,) = interpret(_graph(op, [TensorSpec(x.shape, "float32")]), [x])
    with np.errstate(all="ignore"):
        want = UNARY[op](x)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)
    assert not np.isnan(got).any()


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "mod"])
def test_binary_broadcasts(op: str) -> None:
    rng = np.random.default_rng(1)
    a = rng.uniform(0.5, 2, (2, 1, 4)).astype(np.float32)
    b = rng.uniform(0.5, 2, (3, 1)).astype(np.float32)
    (got,) = interpret(_graph(op, [TensorSpec(a.shape, "float32"), TensorSpec(b.shape, "float32")]), [a, b])
    ref = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
           "minimum": np.minimum, "pow": np.power, "mod": np.remainder}[op]
    assert got.shape == (2, 3, 4)
    np.testing.assert_allclose(got, ref(a, b), rtol=1e-6)


def test_integer_division_rounding_modes() -> None:
    a = np.array([7, -7, 7, -7], dtype=np.int64)
    b = np.array([2, 2, -2, -2], dtype=np.int64)
    specs = [TensorSpec((4,), "int64")] * 2
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    for rounding, torch_mode in (("trunc", "trunc"), ("floor", "floor"), ("none", "trunc")):
        (got,) = interpret(_graph("div", specs, rounding=rounding), [a, b])
        np.testing.assert_array_equal(got, torch.div(ta, tb, rounding_mode=torch_mode).numpy())
    with pytest.raises(EdgerunError, match="division by zero"):
        interpret(_graph("div", specs), [a, np.zeros(4, np.int64)])


def test_comparisons_where_cast() -> None:
    a = np.array([1.5, -2.5, 3.0, np.nan], dtype=np.float32)
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((4,), "float32"))
    mask = b.emit("gt", [x, b.scalar(0.0, x)])
    picked = b.emit("where", [mask, x, b.scalar(-1.0, x)])
    as_int = b.emit("cast", [picked], dtype="int32")
    g.outputs = [mask, as_int]
    got_mask, got_int = interpret(g, [a])
    np.testing.assert_array_equal(got_mask, [True, False, True, False])
    np.testing.assert_array_equal(got_int, [1, -1, 3, -1])


@pytest.mark.parametrize(("src", "dst"), [("float32", "int32"), ("float32", "int64"), ("float16", "int32"),
                                          ("float32", "uint8"), ("float32", "int8")])
def test_float_to_int_cast_truncates_and_saturates_nan_to_zero(src: str, dst: str) -> None:
    # float32 >= 2^31 once wrapped to INT_MIN: the clip ran in float32, where int32's max rounds up to 2^31.
    info = np.iinfo(dst)
    values = np.array([np.nan, np.inf, -np.inf, 2.0**31, -(2.0**31), 3e9, -3e9, 1e30, -1e30, 300.0, -300.0,
                       2.9, -2.9, 0.0], dtype=np.float64)
    with np.errstate(over="ignore"):
        x = values.astype(src)  # float16: the large ones become inf
    g = Graph()
    inp = g.add_input("x", TensorSpec((x.size,), src))
    g.outputs = [Builder(g).emit("cast", [inp], dtype=dst)]
    (got,) = interpret(g, [x])
    want = [0 if np.isnan(v) else int(max(min(np.trunc(v), info.max), info.min)) for v in x.astype(np.float64)]
    assert got.dtype == np.dtype(dst)
    np.testing.assert_array_equal(got.astype(np.int64), want)


@pytest.mark.parametrize("op", ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min"])
@pytest.mark.parametrize(("axes", "keep"), [([1], False), ([0, 2], True), (None, False), ([-1], True)])
def test_reductions(op: str, axes: list[int] | None, keep: bool) -> None:
    x = np.random.default_rng(2).standard_normal((3, 4, 5)).astype(np.float32)
    (got,) = interpret(_graph(op, [TensorSpec(x.shape, "float32")], axes=axes, keepdims=keep), [x])
    fn = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max, "reduce_min": np.min}[op]
    np.testing.assert_allclose(got, fn(x, axis=None if axes is None else tuple(axes), keepdims=keep), rtol=1e-5)


def test_argmax_ties_and_last_index() -> None:
    x = np.array([[1, 3, 3], [2, 2, 0]], dtype=np.float32)
    spec = [TensorSpec(x.shape, "float32")]
    (first,) = interpret(_graph("argmax", spec, axis=1), [x])
    (last,) = interpret(_graph("argmax", spec, axis=1, select_last_index=True), [x])
    np.testing.assert_array_equal(first, [1, 0])
    np.testing.assert_array_equal(last, [2, 1])
    assert first.dtype == np.int64


def test_matmul_batched_broadcast() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2, 1, 4, 5)).astype(np.float32)
    b = rng.standard_normal((3, 5, 6)).astype(np.float32)
    (got,) = interpret(_graph("matmul", [TensorSpec(a.shape, "float32"), TensorSpec(b.shape, "float32")]), [a, b])
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)


def test_conv_and_pool_against_torch() -> None:
    rng = np.random.default_rng(4)
    x = rng.standard_normal((1, 4, 11, 9)).astype(np.float32)
    w = rng.standard_normal((8, 2, 3, 3)).astype(np.float32)
    specs = [TensorSpec(x.shape, "float32"), TensorSpec(w.shape, "float32")]
    (got,) = interpret(_graph("conv2d", specs, stride=[2, 1], padding=[1, 1, 1, 1], dilation=[2, 1], groups=2),
                       [x, w])
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(w), stride=(2, 1), padding=1, dilation=(2, 1), groups=2)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-4, atol=1e-4)
    (mp,) = interpret(_graph("max_pool2d", specs[:1], kernel=[3, 2], stride=[2, 2], padding=[1, 1, 1, 1],
                             ceil_mode=True), [x])
    np.testing.assert_array_equal(mp, F.max_pool2d(torch.from_numpy(x), (3, 2), 2, 1, ceil_mode=True).numpy())


def test_gather_negative_and_out_of_range() -> None:
    data = np.arange(12, dtype=np.float32).reshape(4, 3)
    idx = np.array([[0, -1], [2, 1]], dtype=np.int64)
    g = _graph("gather", [TensorSpec(data.shape, "float32"), TensorSpec(idx.shape, "int64")], axis=0)
    (got,) = interpret(g, [data, idx])
    assert got.shape == (2, 2, 3)
    np.testing.assert_array_equal(got[0, 1], data[3])
    with pytest.raises(EdgerunError, match="out of range"):
        interpret(g, [data, np.array([[0, 4], [0, 0]], dtype=np.int64)])


def test_raster_regions_are_bounds_checked() -> None:
    spec = TensorSpec((4,), "float32")
    with pytest.raises(ValueError, match="leaves its source"):
        infer_specs("raster", [spec], {"regions": [[0, 2, 0, 0, 1, 0, 0, 0, 1, 1, 1, 3]], "shape": [3]})
    with pytest.raises(ValueError, match="leaves its output"):
        infer_specs("raster", [spec], {"regions": [[0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 3]], "shape": [3]})


def test_shape_rules_reject_bad_inputs() -> None:
    f = TensorSpec((2, 3), "float32")
    with pytest.raises(ValueError, match="one dtype"):
        infer_specs("add", [f, TensorSpec((2, 3), "int32")], {})
    with pytest.raises(ValueError, match="broadcast"):
        infer_specs("add", [f, TensorSpec((4,), "float32")], {})
    with pytest.raises(ValueError, match="inner dimensions"):
        infer_specs("matmul", [f, f], {})
    with pytest.raises(ValueError, match="takes 2 inputs"):
        infer_specs("add", [f], {})


def test_verifier_names_the_broken_invariant() -> None:
    g = Graph()
    x = g.add_input("x", TensorSpec((2,), "float32"))
    g.add_node("frobnicate", [x], [TensorSpec((2,), "float32")])
    with pytest.raises(VerificationError, match="frobnicate"):
        verify(g)

    g = Graph()
    x = g.add_input("x", TensorSpec((2,), "float32"))
    g.add_node("exp", ["ghost"], [TensorSpec((2,), "float32")])
    with pytest.raises(VerificationError, match="ghost"):
        verify(g)

    g = Graph()
    x = g.add_input("x", TensorSpec((2,), "float32"))
    (_y,) = g.add_node("exp", [x], [TensorSpec((3,), "float32")])
    with pytest.raises(VerificationError, match="its op makes"):
        verify(g)

    g = Graph()
    x = g.add_input("x", TensorSpec((2,), "float32"))
    g.outputs = ["nowhere"]
    with pytest.raises(VerificationError, match="never defined"):
        verify(g)


def test_bad_user_inputs_get_clear_errors() -> None:
    g = _graph("exp", [TensorSpec((2, 3), "float32")])
    with pytest.raises(EdgerunError, match="shape"):
        interpret(g, [np.zeros((3, 2), np.float32)])
    with pytest.raises(EdgerunError, match="takes 1 inputs"):
        interpret(g, [])
    with pytest.raises(EdgerunError, match="must be float32"):
        interpret(g, [np.zeros((2, 3), np.complex64)])


def test_erf_is_correctly_rounded_float32_across_its_range() -> None:
    import math

    x = np.concatenate([np.linspace(-9, 9, 20001), [0.0, -0.0, 2.5, -2.5, 1e-30, np.inf, -np.inf]]).astype(np.float32)
    (got,) = interpret(_graph("erf", [TensorSpec(x.shape, "float32")]), [x])
    want = np.array([math.erf(float(v)) for v in x]).astype(np.float32)
    np.testing.assert_array_equal(got, want)
    small = x[::50]  # small arrays take the per-element path: the same numbers
    assert small.size < 512
    (got_small,) = interpret(_graph("erf", [TensorSpec(small.shape, "float32")]), [small])
    np.testing.assert_array_equal(got_small, want[::50])


def test_update_slice_writes_rows_at_a_clamped_run_time_start() -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    rows = np.full((2, 3), -1, np.float32)
    g = _graph("update_slice", [TensorSpec((4, 3), "float32"), TensorSpec((2, 3), "float32"),
                                TensorSpec((1,), "int64")], axis=0)
    for start, first in ((1, 1), (3, 2), (-5, 0)):  # clamped so the rows always fit, like dynamic_update_slice
        (got,) = interpret(g, [x, rows, np.array([start])])
        want = x.copy()
        want[first:first + 2] = -1
        np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="does not fit"):  # the shape rule, when the node is built
        _graph("update_slice", [TensorSpec((4, 3), "float32"), TensorSpec((2, 2), "float32"),
                                TensorSpec((), "int64")], axis=0)


@pytest.mark.parametrize("axis, dtype", [(0, "float32"), (1, "float64"), (-1, "int64")])
def test_scatter_add_equals_torch_index_add_with_repeated_indices(axis: int, dtype: str) -> None:
    rng = np.random.default_rng(axis + 5)
    data = rng.integers(-5, 5, (4, 6, 3)).astype(dtype)
    rows = data.shape[axis]
    index = np.array([1, rows - 1, 1, 0, 1], np.int64)  # repeated: each accumulates
    taken = list(data.shape)
    taken[axis] = index.size
    updates = rng.standard_normal(taken).astype(dtype) if dtype != "int64" else rng.integers(-9, 9, taken)
    g = _graph("scatter_add", [TensorSpec(data.shape, dtype), TensorSpec((5,), "int64"),
                               TensorSpec(tuple(taken), dtype)], axis=axis)
    (got,) = interpret(g, [data, index, updates])
    want = torch.from_numpy(data).index_add(axis, torch.from_numpy(index), torch.from_numpy(updates)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-6)
    wrapped = np.where(index == rows - 1, -1, index)  # a negative index wraps once, as gather's does
    (again,) = interpret(g, [data, wrapped, updates])
    np.testing.assert_array_equal(again, got)


def test_scatter_add_of_a_2d_index_equals_torch_scatter_add_and_is_gathers_transpose() -> None:
    rng = np.random.default_rng(3)
    data = rng.standard_normal((5, 4))
    index = rng.integers(0, 5, (3, 4))
    src = rng.standard_normal((3, 4))
    want = torch.from_numpy(data).scatter_add(0, torch.from_numpy(index), torch.from_numpy(src)).numpy()
    flat = index * 4 + np.arange(4)  # torch.scatter_add's element positions, flattened
    g = _graph("scatter_add", [TensorSpec((20,), "float64"), TensorSpec((3, 4), "int64"),
                               TensorSpec((3, 4), "float64")])
    (got,) = interpret(g, [data.reshape(-1), flat, src])
    np.testing.assert_allclose(got.reshape(5, 4), want, rtol=1e-12)
    # <gather(x, i), u> == <x, scatter_add(0, i, u)>: the two are each other's transpose.
    x = rng.standard_normal(20)
    gathered = x[flat]
    assert np.isclose(np.sum(gathered * src), np.sum(x * (got - data.reshape(-1))))


def test_scatter_add_refuses_bad_shapes_types_and_indices() -> None:
    f, i = TensorSpec((4, 3), "float32"), TensorSpec((2,), "int64")
    with pytest.raises(ValueError, match="gather's output shape"):
        _graph("scatter_add", [f, i, TensorSpec((3, 3), "float32")])
    with pytest.raises(ValueError, match="int32 or int64"):
        _graph("scatter_add", [f, TensorSpec((2,), "float32"), TensorSpec((2, 3), "float32")])
    with pytest.raises(ValueError, match="numeric"):
        _graph("scatter_add", [TensorSpec((4,), "bool"), i, TensorSpec((2,), "bool")])
    with pytest.raises(ValueError, match="one dtype"):
        _graph("scatter_add", [f, i, TensorSpec((2, 3), "float64")])
    g = _graph("scatter_add", [f, i, TensorSpec((2, 3), "float32")])
    with pytest.raises(EdgerunError, match=r"out of range \[-4, 4\)"):
        interpret(g, [np.zeros((4, 3), np.float32), np.array([0, 4]), np.ones((2, 3), np.float32)])
