"""ONNX Det by Leibniz's formula matches numpy's determinant (up to 5x5), and refuses larger matrices by name."""

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
