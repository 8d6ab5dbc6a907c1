"""bfloat16, float8, float4, int4/uint4 and int2/uint2 end to end: ONNX Cast, CastLike, QuantizeLinear and
DequantizeLinear on them import, survive the program file, and run on the reference bit for bit as ONNX's own
reference implementation computes them; backends without kernels for them decline their nodes, and an op that
needs float arithmetic on them is refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx import from_onnx
from edgerun.ir.dtypes import DType
from edgerun.program import Program
from edgerun.runtime import load
from tests.onnx.onnx_graphs import device_free_backends

NARROW = {DType.bfloat16: TensorProto.BFLOAT16, DType.float8_e4m3fn: TensorProto.FLOAT8E4M3FN,
          DType.float8_e4m3fnuz: TensorProto.FLOAT8E4M3FNUZ, DType.float8_e5m2: TensorProto.FLOAT8E5M2,
          DType.float8_e5m2fnuz: TensorProto.FLOAT8E5M2FNUZ, DType.float8_e8m0fnu: TensorProto.FLOAT8E8M0,
          DType.float4_e2m1fn: TensorProto.FLOAT4E2M1,
          DType.int4: TensorProto.INT4, DType.uint4: TensorProto.UINT4, DType.int2: TensorProto.INT2,
          DType.uint2: TensorProto.UINT2}
# int16/uint16 quantize through the same float32 lowering as the narrow integers.
CODES = {**NARROW, DType.int16: TensorProto.INT16, DType.uint16: TensorProto.UINT16}
QUANTIZED = [d for d in CODES if d not in (DType.bfloat16, DType.float8_e8m0fnu)]
CAST_CASES = [(d, s, "up") for d in NARROW for s in ((1, 0) if d.is_float8 else (1,))]
CAST_CASES += [(DType.float8_e8m0fnu, s, m) for s in (1, 0) for m in ("up", "down", "nearest")]

# Every edge a narrow type has: zeros of both signs, values that round to even, the largest finite values
# and beyond, infinities, NaN, subnormals, negative values for the unsigned types.
EDGES = np.array([0.0, -0.0, 1e-3, 0.3, 0.75, 1.25, 1.7, -2.5, 3.5, 5.5, 7.49, -8.6, 15.5, 100.0, 240.0, 448.0,
                  464.0, 500.0, 57344.0, 61440.0, 70000.0, 1e9, -1e9, np.inf, -np.inf, np.nan, 2.0**-9, -2.0**-17],
                 np.float32)


def _model(nodes, inputs, outputs, inits=(), opset: int = 25):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, c, s) for n, c, s in inputs],
                              [helper.make_tensor_value_info(n, c, s) for n, c, s in outputs], initializer=list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=11)


def _bits_equal(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes(), (got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("dtype,saturate,mode", CAST_CASES, ids=[f"{d.value}-sat{s}-{m}" for d, s, m in CAST_CASES])
def test_cast_to_and_from_a_narrow_type_matches_onnx_reference_bit_for_bit(dtype: DType, saturate: int,
                                                                           mode: str) -> None:
    code = NARROW[dtype]
    model = _model([helper.make_node("Cast", ["x"], ["q"], to=code, saturate=saturate, round_mode=mode),
                    helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)],
                   [("x", TensorProto.FLOAT, [EDGES.size])],
                   [("q", code, [EDGES.size]), ("y", TensorProto.FLOAT, [EDGES.size])])
    want_q, want_y = ReferenceEvaluator(model).run(None, {"x": EDGES})
    got_q, got_y = load(from_onnx(model), backends=["reference"])(EDGES)
    _bits_equal(got_q, want_q)
    _bits_equal(got_y, want_y)


@pytest.mark.parametrize("dtype", list(NARROW), ids=lambda d: d.value)
def test_castlike_of_a_constant_folds_at_import_like_the_reference(dtype: DType) -> None:
    like = np.zeros(1, dtype.np)
    model = _model([helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", TensorProto.FLOAT,
                                                                                       [EDGES.size], EDGES)),
                    helper.make_node("CastLike", ["c", "like"], ["y"])],
                   [("like", NARROW[dtype], [1])], [("y", NARROW[dtype], [EDGES.size])])
    (want,) = ReferenceEvaluator(model).run(None, {"like": like})
    got = load(from_onnx(model), backends=["reference"])(like)
    _bits_equal(got, want)


@pytest.mark.parametrize("dtype", QUANTIZED, ids=lambda d: d.value)
def test_quantize_and_dequantize_per_axis_match_onnx_reference(dtype: DType) -> None:
    code = CODES[dtype]
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32) * 20
    if dtype in (DType.int16, DType.uint16):
        x *= 3000  # past int16's range, so clipping shows
    scale = np.array([0.5, 2.0, 7.0], np.float32)
    zero = np.array([1, 0, -1] if dtype in (DType.int4, DType.int2, DType.int16) else [1, 2, 0], np.float32)
    if dtype.is_float8 or dtype is DType.float4_e2m1fn:
        zero[:] = 0  # ONNX requires a zero zero point for float8
    inits = [helper.make_tensor("s", TensorProto.FLOAT, [3], scale),
             helper.make_tensor("z", code, [3], zero.astype(dtype.np).astype(np.float32))]
    model = _model([helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], axis=1),
                    helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], axis=1)],
                   [("x", TensorProto.FLOAT, list(x.shape))],
                   [("q", code, list(x.shape)), ("y", TensorProto.FLOAT, list(x.shape))], inits)
    want_q, want_y = ReferenceEvaluator(model).run(None, {"x": x})
    got_q, got_y = load(from_onnx(model), backends=["reference"])(x)
    _bits_equal(got_q, want_q)
    _bits_equal(got_y, want_y)


def test_narrow_constants_survive_the_program_file_one_element_per_byte(tmp_path) -> None:
    w = np.array([[-8, 7, 0], [3, -1, 5]], np.int8)
    model = _model([helper.make_node("DequantizeLinear", ["w", "s"], ["out"]), helper.make_node("Identity", ["w"], ["k"])],
                   [("s", TensorProto.FLOAT, [])], [("out", TensorProto.FLOAT, [2, 3]), ("k", TensorProto.INT4, [2, 3])],
                   [helper.make_tensor("w", TensorProto.INT4, [2, 3], w.ravel().tolist())], opset=21)
    program = from_onnx(model)
    program.save(tmp_path / "m.edgr")
    loaded = Program.read(tmp_path / "m.edgr")
    (held,) = [a for a in loaded.graph.constants.values() if a.dtype == DType.int4.np]
    assert held.nbytes == held.size == 6  # one int4 per byte, as ml_dtypes holds it in memory
    np.testing.assert_array_equal(held.astype(np.int8), w)
    out, k = load(loaded, backends=["reference"])(np.float32(0.25))
    np.testing.assert_array_equal(out, w * 0.25)
    _bits_equal(k, w.astype(DType.int4.np))


def test_an_op_that_needs_float_arithmetic_refuses_a_narrow_type_by_name() -> None:
    model = _model([helper.make_node("Softmax", ["x"], ["y"])], [("x", TensorProto.BFLOAT16, [2, 3])],
                   [("y", TensorProto.BFLOAT16, [2, 3])])
    with pytest.raises(UnsupportedOpError, match="Softmax on bfloat16"):
        from_onnx(model)


@pytest.mark.parametrize("dtype", list(NARROW), ids=lambda d: d.value)
def test_backends_without_narrow_kernels_decline_their_nodes_and_the_reference_runs_them(dtype: DType) -> None:
    """ONNX Runtime's Python binding has no numpy type for these outputs ("No corresponding Numpy type for
    Tensor Type"), MNN, webgpu and the NPU compute in float32/int8: each declines the casts, and placement keeps the
    float32 ops around them on the backend."""
    code = NARROW[dtype]
    model = _model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Cast", ["r"], ["q"], to=code),
                    helper.make_node("Cast", ["q"], ["f"], to=TensorProto.FLOAT),
                    helper.make_node("Relu", ["f"], ["y"])],
                   [("x", TensorProto.FLOAT, [2, 8])], [("y", TensorProto.FLOAT, [2, 8])])
    program = from_onnx(model)
    casts = [n for n in program.graph.nodes if n.op == "cast"]
    assert len(casts) == 2
    backends = device_free_backends()
    assert {b.name for b in backends} >= {"npu", "onnxruntime"}
    for backend in backends:
        assert not any(backend.supports(n, program.graph) for n in casts), (backend.name, dtype)
    x = np.linspace(-3, 30, 16, dtype=np.float32).reshape(2, 8)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    if any(b.name == "onnxruntime" for b in backends):
        loaded = load(program, backends=["onnxruntime"])
        placed = {p.backend for p in loaded.parts.partitions
                  for n in p.subgraph(loaded.parts.graph).nodes if n.op == "cast"}
        assert placed == {"reference"}, placed
        _bits_equal(loaded(x), want)
    _bits_equal(load(program, backends=["reference"])(x), want)


def test_a_narrow_type_without_ml_dtypes_installed_is_a_clear_error(monkeypatch) -> None:
    import sys

    from edgerun.errors import EdgerunError
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)  # what `import ml_dtypes` sees where it is not installed
    assert DType.float32.np == np.float32  # numpy's own types never need it
    with pytest.raises(EdgerunError, match=r"bfloat16.*need the ml_dtypes package"):
        _ = DType.bfloat16.np
