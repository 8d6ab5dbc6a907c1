"""bfloat16 arithmetic: elementwise ops compute in float32 and round each node's output (narrow_float.py),
measured against ONNX's reference (onnx.reference.ReferenceEvaluator) on every finite bfloat16 input; ops that
reduce (Softmax, Attention) and elementwise ops that do not reproduce the reference stay refused by name."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx import from_onnx
from edgerun.frontends.onnx.narrow_float import ELEMENTWISE_VIA_FLOAT32
from edgerun.runtime import load

ml_dtypes = pytest.importorskip("ml_dtypes")
BF = TensorProto.BFLOAT16
SMALLEST_COMPARED = 2.0 ** -6  # below it the reference's own intermediate rounding cancels (exp(x) - 1 -> 0)


def _every_finite_bfloat16() -> np.ndarray:
    x = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)
    return x[np.isfinite(x.astype(np.float32))]


def _domain(op: str, x: np.ndarray) -> np.ndarray:
    f = x.astype(np.float32)
    if op in ("Log", "Sqrt"):
        return x[f > 0]
    if op in ("Asin", "Acos", "Atanh"):
        return x[np.abs(f) < 1]
    return x


def _model(op: str, n: int, extra: tuple = (), **attrs):
    inputs = [helper.make_tensor_value_info("x", BF, [n])] + [helper.make_tensor_value_info(e, BF, [1]) for e in extra]
    node = helper.make_node(op, ["x", *extra], ["y"], **attrs)
    graph = helper.make_graph([node], "g", inputs, [helper.make_tensor_value_info("y", BF, [n])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.asarray(a).view(np.uint16).astype(np.int32)


@pytest.mark.parametrize("op", sorted(ELEMENTWISE_VIA_FLOAT32))
def test_elementwise_bfloat16_matches_the_reference_wherever_its_output_is_normal(op: str) -> None:
    x = _domain(op, _every_finite_bfloat16())
    extra = ("slope",) if op == "PRelu" else ()
    feeds = {"x": x, **({"slope": np.array([0.3], ml_dtypes.bfloat16)} if extra else {})}
    model = _model(op, x.size, extra)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        (want,) = ReferenceEvaluator(model).run(None, feeds)
    program = from_onnx(model)
    assert any(n.op == "cast" for n in program.graph.nodes)  # computed in float32, rounded back
    (got,) = load(program, backends=["reference"]).run([feeds[i.name] for i in model.graph.input])
    assert got.dtype == ml_dtypes.bfloat16 and got.shape == want.shape
    w, g = want.astype(np.float32), got.astype(np.float32)
    compared = (np.abs(w) >= SMALLEST_COMPARED) & np.isfinite(w)
    ulps = np.abs(_bits(got) - _bits(want))[compared]
    assert int(ulps.max(initial=0)) <= 1 and int((ulps > 0).sum()) <= 1, (op, int((ulps > 0).sum()))
    assert np.array_equal(np.isnan(w), np.isnan(g))
    # Where the reference's output is tiny (its intermediate rounding cancels there), the two stay within 2^-6.
    tiny = ~compared & np.isfinite(w)
    assert np.all(np.abs(g[tiny] - w[tiny]) <= SMALLEST_COMPARED)


def test_celu_on_onnx_s_own_bfloat16_case_is_bit_for_bit() -> None:
    x = np.array([-3.0, -0.5, 0.0, 0.5, 3.0], dtype=ml_dtypes.bfloat16)
    model = _model("Celu", 5, alpha=2.0)
    (want,) = ReferenceEvaluator(model).run(None, {"x": x})
    (got,) = load(from_onnx(model), backends=["reference"]).run([x])
    assert np.array_equal(_bits(got), _bits(want))


def test_division_of_bfloat16_is_true_division() -> None:
    """The reference kernels took ml_dtypes floats (numpy kind 'V') for integers and truncated the quotient."""
    a = np.array([-3.0, 0.5, 3.0, 1.0], ml_dtypes.bfloat16)
    b = np.array([2.0, 2.0, 4.0, 3.0], ml_dtypes.bfloat16)
    inputs = [helper.make_tensor_value_info(n, BF, [4]) for n in "ab"]
    graph = helper.make_graph([helper.make_node("Div", ["a", "b"], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", BF, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)
    (want,) = ReferenceEvaluator(model).run(None, {"a": a, "b": b})
    (got,) = load(from_onnx(model), backends=["reference"]).run([a, b])
    assert np.array_equal(_bits(got), _bits(want))
    assert got.astype(np.float32).tolist() == [-1.5, 0.25, 0.75, 0.333984375]


@pytest.mark.parametrize("op", ["Softmax", "Sigmoid", "LogSoftmax"])
def test_ops_float32_does_not_reproduce_on_bfloat16_are_refused_by_name(op: str) -> None:
    with pytest.raises(UnsupportedOpError, match=f"{op} on bfloat16: float32 arithmetic .* does not reproduce"):
        from_onnx(_model(op, 8))
