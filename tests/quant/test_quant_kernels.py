"""The exact integer kernels against ONNX Runtime's integer ops on random data, and their own invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from quant_ort_nodes import run_ort, single_node_model

from edgerun.oracle.quant_kernels import (
    QUANT_KERNELS,
    dynamic_qparams,
    pack_int4,
    quantize_values,
    requantize_values,
    unpack_int4,
)


def _run(op: str, ins: list[np.ndarray], out_shapes: list[tuple[tuple[int, ...], np.dtype]], **attrs: object) -> list[np.ndarray]:
    outs = [np.empty(s, d) for s, d in out_shapes]
    QUANT_KERNELS[op](ins, dict(attrs), outs)
    return outs


def _q(rng: np.random.Generator, shape: tuple[int, ...], dtype: type) -> np.ndarray:
    lo, hi = np.iinfo(dtype).min, np.iinfo(dtype).max
    return rng.integers(lo, hi + 1, size=shape).astype(dtype)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("per_axis", [False, True])
def test_quantize_linear_is_bit_exact_with_onnxruntime(dtype: type, per_axis: bool) -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 3, 5, 7)) * 40).astype(np.float32)
    x[0, 0, 0, :4] = [0.5, 1.5, 2.5, -2.5]  # exact ties: half to even
    # Per tensor, scale 1 keeps the ties exact; per axis, random scales.
    scale = (rng.random(3) * 0.5 + 0.05).astype(np.float32) if per_axis else np.array(1.0, np.float32)
    zp = _q(rng, scale.shape, dtype) if per_axis else np.array(3, dtype)
    want = run_ort(single_node_model("QuantizeLinear", [x, scale, zp], axis=1), [x, scale, zp])[0]
    view = (3, 1, 1) if per_axis else ()
    got = quantize_values(x, scale.reshape(view), zp.reshape(view))
    np.testing.assert_array_equal(got, want)


def test_dequantize_linear_matches_onnxruntime() -> None:
    rng = np.random.default_rng(1)
    q, scale, zp = _q(rng, (4, 6), np.int8), np.array([0.1, 0.7, 0.3, 2.0], np.float32), _q(rng, (4,), np.int8)
    want = run_ort(single_node_model("DequantizeLinear", [q, scale, zp], axis=0), [q, scale, zp])[0]
    got = _run("dequantize_linear", [q, scale.reshape(4, 1), zp.reshape(4, 1)], [((4, 6), np.float32)])[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
def test_matmul_integer_is_bit_exact_with_onnxruntime(a_dtype: type, b_dtype: type) -> None:
    rng = np.random.default_rng(2)
    a, b = _q(rng, (2, 5, 300), a_dtype), _q(rng, (300, 7), b_dtype)
    if (a_dtype, b_dtype) == (np.uint8, np.int8):
        b //= 2  # 7-bit weights: ORT's AVX2 u8s8 kernel saturates int16 pair sums otherwise (next test)
    a_zp, b_zp = _q(rng, (), a_dtype), _q(rng, (7,), b_dtype)
    want = run_ort(single_node_model("MatMulInteger", [a, b, a_zp, b_zp]), [a, b, a_zp, b_zp])[0]
    got = _run("matmul_integer", [a, b, a_zp, b_zp], [((2, 5, 7), np.int32)])[0]
    np.testing.assert_array_equal(got, want)


def test_full_range_u8s8_is_exact_where_onnxruntime_avx2_saturates() -> None:
    # vpmaddubsw adds two u8*s8 products into int16 with saturation: 255*127*2 overflows. We stay exact.
    rng = np.random.default_rng(7)
    a, b = np.full((2, 64), 255, np.uint8), np.full((64, 3), 127, np.int8)
    zero_a, zero_b = np.array(0, np.uint8), np.array(0, np.int8)
    got = _run("matmul_integer", [a, b, zero_a, zero_b], [((2, 3), np.int32)])[0]
    assert (got == 255 * 127 * 64).all()
    a, b = _q(rng, (4, 300), np.uint8), _q(rng, (300, 5), np.int8)
    got = _run("matmul_integer", [a, b, zero_a, zero_b], [((4, 5), np.int32)])[0]
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))


@pytest.mark.parametrize("groups,stride,pads,per_channel", [(1, 1, [1, 1, 1, 1], False), (2, 2, [0, 1, 2, 0], True),
                                                            (6, 1, [1, 1, 1, 1], False)])
def test_conv_integer_is_bit_exact_with_onnxruntime(groups: int, stride: int, pads: list[int], per_channel: bool) -> None:
    rng = np.random.default_rng(3)
    x, w = _q(rng, (2, 6, 9, 8), np.uint8), _q(rng, (12, 6 // groups, 3, 3), np.uint8)
    x_zp = np.array(117, np.uint8)
    w_zp = _q(rng, (12,), np.uint8) if per_channel else np.array(9, np.uint8)
    if per_channel:  # ONNX Runtime refuses a per-channel weight zero point: fold it into the weight instead
        ws = (w.astype(np.int64) - w_zp.reshape(-1, 1, 1, 1)).astype(np.int32)
        xs = x.astype(np.int32) - int(x_zp)
        model = single_node_model("Conv", [xs.astype(np.float32), ws.astype(np.float32)], group=groups,
                                  strides=[stride, stride], pads=pads)
        want = np.rint(run_ort(model, [xs.astype(np.float32), ws.astype(np.float32)])[0]).astype(np.int32)
    else:
        model = single_node_model("ConvInteger", [x, w, x_zp, w_zp], group=groups, strides=[stride, stride],
                                  pads=pads)
        want = run_ort(model, [x, w, x_zp, w_zp])[0]
    got = _run("conv_integer", [x, w, x_zp, w_zp.reshape(-1, 1, 1, 1)], [(want.shape, np.int32)],
               stride=stride, padding=pads, groups=groups)[0]
    np.testing.assert_array_equal(got, want)


def test_dynamic_quantize_is_bit_exact_with_onnxruntime() -> None:
    rng = np.random.default_rng(4)
    for x in [(rng.standard_normal((3, 17)) * 5).astype(np.float32), np.abs(rng.standard_normal((4, 4))).astype(np.float32),
              np.zeros((2, 3), np.float32)]:
        want = run_ort(single_node_model("DynamicQuantizeLinear", [x], n_outputs=3), [x])
        got = _run("dynamic_quantize", [x], [(x.shape, np.uint8), ((), np.float32), ((), np.uint8)])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)


def test_qlinear_matmul_within_one_step_of_onnxruntime() -> None:
    # QLinearMatMul = matmul_integer then requantize; ONNX Runtime requantizes in float32 (see the kernel doc).
    rng = np.random.default_rng(5)
    a, b = _q(rng, (8, 64), np.uint8), _q(rng, (64, 16), np.int8) // 2  # 7-bit: see the saturation test
    sa, za, sb, zb = np.array(0.02, np.float32), np.array(128, np.uint8), np.array(0.01, np.float32), np.array(0, np.int8)
    sy, zy = np.array(0.9, np.float32), np.array(100, np.uint8)
    ins = [a, sa, za, b, sb, zb, sy, zy]
    want = run_ort(single_node_model("QLinearMatMul", ins), ins)[0]
    acc = _run("matmul_integer", [a, b, za, zb], [((8, 16), np.int32)])[0]
    got = requantize_values(acc, np.float32(sa * sb / sy), zy)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert (got == want).mean() > 0.95


@pytest.mark.parametrize("group,with_zp", [(32, True), (64, False), (128, True)])
def test_matmul_int4_matches_onnxruntime_matmulnbits(group: int, with_zp: bool) -> None:
    rng = np.random.default_rng(6)
    k, n = 200, 24  # K not a multiple of the group: the last group is padded
    blocks = -(-k // group)
    q = rng.integers(0, 16, size=(n, blocks, group)).astype(np.uint8)
    packed = pack_int4(q)
    scales = (rng.random((n, blocks)) * 0.1 + 0.01).astype(np.float32)
    zp = rng.integers(0, 16, size=(n, blocks)).astype(np.uint8)
    a = rng.standard_normal((3, k)).astype(np.float32)
    zp_packed = pack_int4(np.pad(zp, ((0, 0), (0, blocks % 2)))).reshape(-1) if with_zp else None
    ins = [a, packed, scales.reshape(-1), zp_packed]
    model = single_node_model("MatMulNBits", ins, domain="com.microsoft", K=k, N=n, bits=4, block_size=group,
                              output_shape=[3, n])
    want = run_ort(model, ins)[0]
    got = _run("matmul_int4", [a, packed, scales] + ([zp] if with_zp else []), [((3, n), np.float32)],
               k=k, n=n, group_size=group)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [32, 64, 128])
def test_matmul_int4_minimum_form_dequantizes_each_group_with_its_float_zero_point(group: int) -> None:
    """float32 zero points (GGUF Q4_1's minimum form, `w = (q - zp) * scale`): every group's own, against the
    whole dequantized weight built here in float64."""
    rng = np.random.default_rng(group)
    k, n = 3 * group - 8, 5  # K padded in the last group
    blocks = -(-k // group)
    q = rng.integers(0, 16, size=(n, blocks, group)).astype(np.uint8)
    scales = (rng.random((n, blocks)) * 0.1 + 0.01).astype(np.float32)
    zp = (rng.standard_normal((n, blocks)) * 4).astype(np.float32)  # not integers: a minimum, not a code
    a = rng.standard_normal((2, k)).astype(np.float32)
    got = _run("matmul_int4", [a, pack_int4(q), scales, zp], [((2, n), np.float32)], k=k, n=n, group_size=group)[0]
    w = ((q.astype(np.float64) - zp[:, :, None]) * scales[:, :, None]).reshape(n, -1)[:, :k]
    np.testing.assert_allclose(got, a.astype(np.float64) @ w.T, rtol=1e-5, atol=1e-5)


# ---- properties --------------------------------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(acc=st.lists(st.integers(-(2 ** 31), 2 ** 31 - 1), min_size=1, max_size=16),
       scale=st.floats(2.0 ** -30, 1e3, width=32), zp=st.integers(-128, 127))
def test_requantize_equals_exact_rational_rounding(acc: list[int], scale: float, zp: int) -> None:
    from fractions import Fraction
    got = requantize_values(np.array(acc, np.int32), np.float32(scale), np.array(zp, np.int8))
    exact = Fraction(float(np.float32(scale)))
    want = [max(-128, min(127, round(Fraction(a) * exact) + zp)) for a in acc]  # Python's round: half to even
    assert got.tolist() == want


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, width=32, allow_subnormal=False), min_size=1, max_size=32), st.booleans())
def test_dynamic_quantize_roundtrip_error_is_at_most_half_a_step(values: list[float], signed: bool) -> None:
    x = np.array(values, np.float32)
    dtype = np.dtype(np.int8 if signed else np.uint8)
    scale, zp = dynamic_qparams(x, dtype, per_token=False)
    q = quantize_values(x, scale, zp)
    back = (q.astype(np.float64) - zp.astype(np.float64)) * float(scale)
    # Half a step plus the float32 division's rounding; zero is always exact.
    assert np.all(np.abs(back - x) <= float(scale) * 0.5001 + 1e-6 * np.abs(x))
    assert quantize_values(np.zeros(1, np.float32), scale, zp)[0] == zp


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(1, 40), st.integers(1, 6), st.integers(0, 255), st.integers(-128, 127))
def test_matmul_integer_equals_python_integers(m: int, k: int, n: int, a_zp: int, b_zp: int) -> None:
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, b = _q(rng, (m, k), np.uint8), _q(rng, (k, n), np.int8)
    got = _run("matmul_integer", [a, b, np.array(a_zp, np.uint8), np.array(b_zp, np.int8)], [((m, n), np.int32)])[0]
    want = [[sum((int(a[i, t]) - a_zp) * (int(b[t, j]) - b_zp) for t in range(k)) for j in range(n)] for i in range(m)]
    assert got.tolist() == want


def test_int4_pack_roundtrip() -> None:
    v = np.arange(32, dtype=np.uint8).reshape(2, 16) % 16
    packed = pack_int4(v)
    assert packed.shape == (2, 8) and packed[0, 0] == 0x10
    np.testing.assert_array_equal(unpack_int4(packed), v)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 24), st.booleans(), st.integers(0, 2 ** 31))
def test_per_token_dynamic_quantize_is_each_row_quantized_alone(rows: int, width: int, signed: bool, seed: int) -> None:
    """per_token: one (scale, zero point) per row of the last axis, the same as quantizing that row by itself, so
    a loud token does not coarsen a quiet one."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, width)) * 10.0 ** rng.integers(-3, 4, size=(rows, 1))).astype(np.float32)
    dtype = np.dtype(np.int8 if signed else np.uint8)
    outs = _run("dynamic_quantize", [x], [((rows, width), dtype), ((rows, 1), np.float32), ((rows, 1), dtype)],
                per_token=True)
    for i in range(rows):
        scale, zp = dynamic_qparams(x[i], dtype, per_token=False)
        assert outs[1][i, 0] == scale and outs[2][i, 0] == zp
        np.testing.assert_array_equal(outs[0][i], quantize_values(x[i], scale, zp))

