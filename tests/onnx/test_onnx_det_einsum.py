"""ONNX Det by Leibniz's formula (up to 5x5; larger refused by name) and Einsum diagonals match numpy."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx import from_onnx
from edgerun.oracle import interpret
from tests.onnx.onnx_graphs import make_model, value_info


@pytest.mark.parametrize("n", [1, 3, 4, 5])
@pytest.mark.parametrize("elem,dtype", [(TensorProto.FLOAT, np.float32), (TensorProto.DOUBLE, np.float64)])
def test_det_matches_numpy(n, elem, dtype):
    model = make_model([helper.make_node("Det", ["x"], ["y"])], [value_info("x", [2, 3, n, n], elem)],
                       [value_info("y", [2, 3], elem)])
    x = np.random.default_rng(n).standard_normal((2, 3, n, n)).astype(dtype)
    x[0, 0, -1] = x[0, 0, 0]  # a singular matrix among them
    got = interpret(from_onnx(model).graph, [x])[0]
    assert got.dtype == dtype and got.shape == (2, 3)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(got, np.linalg.det(x), rtol=tol, atol=tol)


def test_det_of_a_large_matrix_is_refused():
    model = make_model([helper.make_node("Det", ["x"], ["y"])], [value_info("x", [6, 6])], [value_info("y", [])])
    with pytest.raises(UnsupportedOpError, match="Det of 6x6"):
        from_onnx(model)


@pytest.mark.parametrize("equation,shapes", [("ii->i", [(4, 4)]), ("ii", [(3, 3)]), ("bii,bi->b", [(2, 3, 3), (2, 3)]),
                                             ("iji->j", [(3, 2, 3)])])
def test_einsum_diagonals_match_numpy(equation, shapes):
    names = [f"x{i}" for i in range(len(shapes))]
    xs = [np.random.default_rng(1).standard_normal(s).astype(np.float32) for s in shapes]
    want = np.einsum(equation, *xs)
    model = make_model([helper.make_node("Einsum", names, ["y"], equation=equation)],
                       [value_info(n, list(s)) for n, s in zip(names, shapes)], [value_info("y", list(want.shape))])
    got = interpret(from_onnx(model).graph, xs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
