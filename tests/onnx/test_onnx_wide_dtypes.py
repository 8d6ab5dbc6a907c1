"""float64, int16, uint16, uint32 and uint64 end to end: ONNX graphs of each type import, run on edgerun's
reference kernels and on ONNX Runtime's delegate, and agree with ONNX Runtime on the original model; the
element types numpy has no type for stay refused with a message naming them."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx import from_onnx
from edgerun.ir.dtypes import DType
from edgerun.runtime import load

CODES = {DType.float64: TensorProto.DOUBLE, DType.int16: TensorProto.INT16, DType.uint16: TensorProto.UINT16,
         DType.uint32: TensorProto.UINT32, DType.uint64: TensorProto.UINT64}


def _ort(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, c, s) for n, c, s in inputs],
                              [helper.make_tensor_value_info(n, c, s) for n, c, s in outputs], initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _values(dtype: DType, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if dtype.is_float:
        return rng.standard_normal(shape).astype(dtype.np)
    info = np.iinfo(dtype.np)
    # The whole range, extremes included, so a computation in a narrower or signed type would show.
    return rng.integers(info.min, info.max, size=shape, dtype=dtype.np, endpoint=True)


@pytest.mark.parametrize("dtype", list(CODES), ids=lambda d: d.value)
def test_integer_and_float_graph_matches_onnxruntime(dtype: DType) -> None:
    """Add and Mul wrap modulo 2^width for integers (ONNX's and numpy's rule); a Transpose and a Slice
    reach ONNX Runtime as layout; a Cast to int64/float32 and an Equal cross type boundaries."""
    code = CODES[dtype]
    rng = np.random.default_rng(12)
    k = _values(dtype, (4, 3), rng)
    nodes = [helper.make_node("Add", ["a", "b"], ["s"]), helper.make_node("Mul", ["s", "k"], ["p"]),
             helper.make_node("Transpose", ["p"], ["t"], perm=[1, 0]),
             helper.make_node("Slice", ["t", "starts", "ends"], ["y"]),
             helper.make_node("Cast", ["y"], ["c"], to=TensorProto.FLOAT if dtype.is_float else TensorProto.INT64),
             helper.make_node("Equal", ["a", "b"], ["e"])]
    inits = [numpy_helper.from_array(k, "k"), numpy_helper.from_array(np.array([1, 0], np.int64), "starts"),
             numpy_helper.from_array(np.array([3, 3], np.int64), "ends")]
    model = _model(nodes, [("a", code, [4, 3]), ("b", code, [4, 3])],
                   [("y", code, [2, 3]), ("c", TensorProto.FLOAT if dtype.is_float else TensorProto.INT64, [2, 3]),
                    ("e", TensorProto.BOOL, [4, 3])], inits)
    a, b = _values(dtype, (4, 3), rng), _values(dtype, (4, 3), rng)
    b[0] = a[0]  # some equal pairs
    want = _ort(model, {"a": a, "b": b})
    program = from_onnx(model)
    assert program.graph.specs[program.graph.inputs[0]].dtype is dtype
    for backends in (["reference"], ["onnxruntime"]):
        got = load(program, backends=backends)(a, b)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype
            np.testing.assert_array_equal(g, w)  # integer arithmetic is exact; float64 add/mul round once


def test_float64_math_keeps_double_precision_on_both_backends() -> None:
    """A float64 MatMul, Exp and ReduceSum give float64 answers (not float32 ones widened): 1 + 1e-12
    survives, which float32 would round to 1."""
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 4))
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Exp", ["m"], ["e"]),
             helper.make_node("Add", ["e", "tiny"], ["t"]),
             helper.make_node("ReduceSum", ["t", "axes"], ["y"], keepdims=0)]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(1e-12), "tiny"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    model = _model(nodes, [("x", TensorProto.DOUBLE, [3, 5])], [("y", TensorProto.DOUBLE, [3])], inits)
    x = rng.standard_normal((3, 5)) * 0.1
    (want,) = _ort(model, {"x": x})
    program = from_onnx(model)
    assert program.graph.constants[next(n for n in program.graph.constants if
                                        program.graph.constants[n].shape == (5, 4))].dtype == np.float64
    for backends in (["reference"], ["onnxruntime"]):
        loaded = load(program, backends=backends)
        placed = {n.op: p.backend for p in loaded.parts.partitions for n in p.subgraph(loaded.parts.graph).nodes}
        assert placed["matmul"] == placed["add"] == backends[0], placed
        got = loaded(x)
        assert got.dtype == np.float64
        np.testing.assert_allclose(got, want, rtol=1e-14, atol=0)
    exact = np.exp(x @ w).astype(np.float64).sum(axis=1) + 4e-12
    assert np.max(np.abs(want - exact)) < 1e-13  # the 1e-12 terms are there: float32 would lose them


def test_onnxruntime_delegate_takes_float64_arithmetic_and_int16_layout() -> None:
    """float64 Add/MatMul and the layout of every new type run inside ONNX Runtime; int16 Max, which ONNX
    Runtime has no kernel for, is declined and runs on the reference kernels."""
    nodes = [helper.make_node("Max", ["a", "b"], ["m"]), helper.make_node("Transpose", ["m"], ["y"], perm=[1, 0])]
    model = _model(nodes, [("a", TensorProto.INT16, [2, 3]), ("b", TensorProto.INT16, [2, 3])],
                   [("y", TensorProto.INT16, [3, 2])])
    loaded = load(from_onnx(model), backends=["onnxruntime"])
    placed = {n.op: p.backend for p in loaded.parts.partitions for n in p.subgraph(loaded.parts.graph).nodes}
    assert placed["maximum"] == "reference" and placed["raster"] == "onnxruntime", placed
    a = np.array([[-32768, 5, 7], [32767, -1, 0]], np.int16)
    b = np.array([[0, -5, 9], [1, -2, 0]], np.int16)
    np.testing.assert_array_equal(loaded(a, b), np.maximum(a, b).T)


@pytest.mark.parametrize("code,name", [(TensorProto.COMPLEX64, "COMPLEX64"), (TensorProto.COMPLEX128, "COMPLEX128")])
def test_types_edgerun_does_not_hold_are_refused_by_name(code: int, name: str) -> None:
    model = _model([helper.make_node("Identity", ["x"], ["y"])], [("x", code, [2])], [("y", code, [2])])
    with pytest.raises(UnsupportedOpError, match=f"element type {name} is not supported"):
        from_onnx(model)


@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_uint64_shift_is_refused_rather_than_computed_in_int64(direction: str) -> None:
    model = _model([helper.make_node("BitShift", ["x", "s"], ["y"], direction=direction)],
                   [("x", TensorProto.UINT64, [2]), ("s", TensorProto.UINT64, [2])], [("y", TensorProto.UINT64, [2])])
    with pytest.raises(UnsupportedOpError, match="shift of uint64"):
        from_onnx(model)


@pytest.mark.parametrize("dtype", [DType.int16, DType.uint16, DType.uint32], ids=lambda d: d.value)
def test_bitwise_ops_of_16_and_32_bit_types_match_numpy(dtype: DType) -> None:
    code = CODES[dtype]
    rng = np.random.default_rng(9)
    a, b = _values(dtype, (6,), rng), _values(dtype, (6,), rng)
    ops = [("BitwiseAnd", np.bitwise_and), ("BitwiseOr", np.bitwise_or), ("BitwiseXor", np.bitwise_xor)]
    nodes = [helper.make_node(op, ["a", "b"], [op]) for op, _ in ops] + [helper.make_node("BitwiseNot", ["a"], ["n"])]
    model = _model(nodes, [("a", code, [6]), ("b", code, [6])],
                   [(op, code, [6]) for op, _ in ops] + [("n", code, [6])], [])
    model.opset_import[0].version = 18
    got = load(from_onnx(model), backends=["reference"])(a, b)
    for g, (_, fn) in zip(got, ops):
        np.testing.assert_array_equal(g, fn(a, b))
    np.testing.assert_array_equal(got[-1], np.invert(a))


def _double_model(op: str, shape: list[int], inits=(), extra_inputs=(), out_shape=None, **attrs):
    """One float64 node on input x (plus `extra_inputs`), output y of `out_shape` (x's shape by default)."""
    node = helper.make_node(op, ["x", *[i.name for i in inits], *[n for n, _ in extra_inputs]], ["y"], **attrs)
    inputs = [("x", TensorProto.DOUBLE, shape), *[(n, TensorProto.DOUBLE, s) for n, s in extra_inputs]]
    model = _model([node], inputs, [("y", TensorProto.DOUBLE, out_shape or shape)], inits)
    model.opset_import[0].version = 20
    return model


def _reference(model, *xs: np.ndarray) -> np.ndarray:
    return load(from_onnx(model), backends=["reference"])(*xs)


def test_float64_erf_is_double_precision() -> None:
    """Erf's whole-array series is float32-accurate; float64 takes math.erf (ONNX's reference evaluator is
    itself single precision here, so the check is against math.erf)."""
    import math
    x = np.linspace(-4, 4, 2001)
    np.testing.assert_allclose(_reference(_double_model("Erf", [2001]), x), [math.erf(v) for v in x],
                               rtol=1e-15, atol=1e-16)


def test_float64_layer_norm_is_computed_in_double() -> None:
    """stash_type float32 widens float16; float64 stays float64, as in ONNX Runtime and ONNX's reference."""
    x = np.random.default_rng(4).standard_normal((2, 3, 5)) * 100 + 7
    scale = np.linspace(0.5, 2.0, 5)
    model = _double_model("LayerNormalization", [2, 3, 5], [numpy_helper.from_array(scale, "s")], axis=-1)
    centred = x - x.mean(-1, keepdims=True)
    exact = centred / np.sqrt((centred ** 2).mean(-1, keepdims=True) + float(np.float32(1e-5))) * scale
    np.testing.assert_allclose(_reference(model, x), exact, rtol=1e-13, atol=1e-13)  # float32 is off by 1e-7


def test_float64_grid_sample_matches_torch_in_double() -> None:
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    x, g = rng.standard_normal((1, 2, 4, 5)), rng.uniform(-1.1, 1.1, (1, 3, 2, 2))
    model = _double_model("GridSample", [1, 2, 4, 5], extra_inputs=[("g", list(g.shape))], out_shape=[1, 2, 3, 2],
                          mode="linear")
    want = torch.nn.functional.grid_sample(torch.from_numpy(x), torch.from_numpy(g), align_corners=False).numpy()
    np.testing.assert_allclose(_reference(model, x, g), want, rtol=1e-13, atol=1e-14)


def test_float64_activations_use_onnx_float32_attribute_defaults() -> None:
    """ONNX stores FLOAT attributes, defaults included, as float32: LeakyRelu's 0.01 is float32(0.01), which a
    float64 graph can tell from 0.01; HardSwish is x * HardSigmoid(alpha=float32(1/6))."""
    x = np.array([-3.0, -1.0, 0.5, 2.0])
    np.testing.assert_array_equal(_reference(_double_model("LeakyRelu", [4]), x),
                                  np.where(x > 0, x, x * float(np.float32(0.01))))
    np.testing.assert_array_equal(_reference(_double_model("HardSwish", [4]), x),
                                  x * np.clip(x * float(np.float32(1 / 6)) + 0.5, 0, 1))


@pytest.mark.parametrize("op", ["Atan", "Asin", "Acos"])
def test_float64_inverse_trig_is_refused_not_single_precision(op: str) -> None:
    with pytest.raises(UnsupportedOpError, match=f"{op} of float64"):
        from_onnx(_double_model(op, [3]))


@pytest.mark.parametrize("dtype", [DType.uint32, DType.int16, DType.float64], ids=lambda d: d.value)
@pytest.mark.parametrize("exclusive,reverse", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_cumprod_matches_numpy_and_wraps_like_it(dtype: DType, exclusive: int, reverse: int) -> None:
    x = (np.arange(1, 25).reshape(2, 12) * 37).astype(dtype.np)  # the products overflow 16 and 32 bits
    node = helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)
    model = _model([node], [("x", CODES[dtype], [2, 12])], [("y", CODES[dtype], [2, 12])],
                   [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    model.opset_import[0].version = 26
    src = x[:, ::-1] if reverse else x
    with np.errstate(over="ignore"):
        want = np.cumprod(src, axis=1, dtype=dtype.np)
        if exclusive:
            want = np.concatenate([np.ones((2, 1), dtype.np), want[:, :-1]], axis=1)
    want = want[:, ::-1] if reverse else want
    np.testing.assert_array_equal(load(from_onnx(model), backends=["reference"])(x), want)
