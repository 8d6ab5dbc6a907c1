"""The resize and conv_transpose2d composites: their decompositions against ONNX's reference Resize and
PyTorch's conv_transpose2d, and the shape of those decompositions (a copy, not a matmul, for nearest)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from numpy_only import lazy

from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph
from edgerun.ir.ops.resize_ops import COORDINATE_MODES, NEAREST_MODES
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.passes.decompose_pass import DecomposePass

# The outside oracles, imported by the tests that use them (the others run in the numpy-only tier).
torch = lazy("torch")
F = lazy("torch.nn.functional")
onnx_resize = lazy("onnx.reference.ops.op_resize")

RNG = np.random.default_rng(3)


def _onnx_resize(x: np.ndarray, scales: list[float], mode: str, ctm: str, nearest_mode: str) -> np.ndarray:
    op = onnx_resize.Resize.__new__(onnx_resize.Resize)  # the reference's kernel alone, without building a node
    return op._run(x, None, np.array(scales, np.float32), None, mode=mode, coordinate_transformation_mode=ctm,
                   nearest_mode=nearest_mode, antialias=0, axes=None, cubic_coeff_a=-0.75, exclude_outside=0,
                   extrapolation_value=0.0, keep_aspect_ratio_policy="stretch")[0]


def _resize_graph(shape: tuple[int, ...], scales: list[float], mode: str, ctm: str, nearest_mode: str) -> Graph:
    g = Graph()
    x = g.add_input("x", TensorSpec(shape, "float32"))
    out = [int(np.float32(s) * n) for s, n in zip(scales, shape)]
    g.outputs = [Builder(g).emit("resize", [x], mode=mode, coordinate_transformation_mode=ctm,
                                 nearest_mode=nearest_mode, scales=[float(np.float32(s)) for s in scales], shape=out)]
    return g


SCALES = [[1.0, 1.0, 2.0, 2.0], [1.0, 1.0, 0.5, 3.0], [1.0, 1.0, 1.6, 0.75], [1.0, 1.0, 1.0, 2.5]]


@pytest.mark.parametrize(("ctm", "nearest_mode", "scales"),
                         list(itertools.product(COORDINATE_MODES, NEAREST_MODES, SCALES)))
def test_nearest_resize_matches_onnx_reference(ctm: str, nearest_mode: str, scales: list[float]) -> None:
    x = RNG.standard_normal((1, 2, 6, 4)).astype(np.float32)
    got = interpret(_resize_graph(x.shape, scales, "nearest", ctm, nearest_mode), [x])[0]
    np.testing.assert_array_equal(got, _onnx_resize(x, scales, "nearest", ctm, nearest_mode))


@pytest.mark.parametrize(("ctm", "scales"), list(itertools.product(COORDINATE_MODES, SCALES)))
def test_linear_resize_matches_onnx_reference(ctm: str, scales: list[float]) -> None:
    x = RNG.standard_normal((1, 2, 6, 4)).astype(np.float32)
    got = interpret(_resize_graph(x.shape, scales, "linear", ctm, "round_prefer_floor"), [x])[0]
    np.testing.assert_allclose(got, _onnx_resize(x, scales, "linear", ctm, "round_prefer_floor"), rtol=1e-5,
                               atol=1e-6)


def test_whole_factor_nearest_upsampling_lowers_to_copies_only() -> None:
    g = _resize_graph((1, 8, 30, 40), [1.0, 1.0, 2.0, 2.0], "nearest", "asymmetric", "floor")
    lowered = DecomposePass().call(g).graph
    assert set(lowered.op_counts()) == {"raster"}
    assert all(len(n.attrs["regions"]) == 1 for n in lowered.nodes)


def test_resize_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="resize mode"):
        _resize_graph((1, 1, 2, 2), [1.0, 1.0, 2.0, 2.0], "cubic", "asymmetric", "floor")


CONV_T = [  # x shape, weight shape, stride, dilation, padding (t, l, b, r), output_padding, groups, bias
    ((1, 4, 6, 5), (4, 3, 2, 2), (2, 2), (1, 1), (0, 0, 0, 0), (0, 0), 1, True),
    ((2, 4, 5, 6), (4, 3, 3, 2), (2, 3), (1, 2), (1, 0, 1, 0), (1, 2), 2, False),
    ((1, 6, 4, 4), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1, 1, 1), (0, 0), 6, True),
]


@pytest.mark.parametrize("case", CONV_T)
@pytest.mark.parametrize("weight_is_constant", [True, False])
def test_conv_transpose_matches_torch(case: tuple, weight_is_constant: bool) -> None:
    xs, ws, stride, dil, pads, out_pad, groups, has_bias = case
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    bias = RNG.standard_normal(ws[1] * groups).astype(np.float32)
    g = Graph()
    xv = g.add_input("x", TensorSpec(xs, "float32"))
    wv = g.add_constant(w, hint="w") if weight_is_constant else g.add_input("w", TensorSpec(ws, "float32"))
    ins = [xv, wv] + ([g.add_constant(bias, hint="b")] if has_bias else [])
    g.outputs = [Builder(g).emit("conv_transpose2d", ins, stride=list(stride), dilation=list(dil),
                                 padding=list(pads), output_padding=list(out_pad), groups=groups)]
    got = interpret(g, [x] if weight_is_constant else [x, w])[0]
    # torch's padding is symmetric: take its uncropped output, add output_padding's rows and columns (which
    # no input reaches) at the bottom and right, then crop (top, left, bottom, right) and add the bias.
    full = F.conv_transpose2d(torch.from_numpy(x), torch.from_numpy(w), None, stride=stride, dilation=dil,
                              groups=groups).numpy()
    full = np.pad(full, [(0, 0), (0, 0), (0, out_pad[0]), (0, out_pad[1])])
    want = full[:, :, pads[0]:full.shape[2] - pads[2], pads[1]:full.shape[3] - pads[3]]
    if has_bias:
        want = want + bias[None, :, None, None]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
