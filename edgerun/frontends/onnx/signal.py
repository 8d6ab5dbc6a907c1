"""DFT (and STFT: framed, windowed DFTs) as two real matmuls with constant cosine and sine matrices (exact in structure, O(n^2) work).

The last axis holds [real] or [real, imaginary]; the transform runs along `axis`. dft_length truncates or
zero-pads the signal. One-sided inverse transforms (numpy's irfft) are computed in float64; two-sided ones
are refused (see the comment in dft()).
"""

from __future__ import annotations

import math

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out, onnx_dtype
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType


def _along(ctx: ImportContext, x: str, axis: int, mat: np.ndarray) -> str:
    """x @ mat along `axis` of x."""
    shape = ctx.b.shape(x)
    perm = [d for d in range(len(shape)) if d != axis] + [axis]
    xt = ctx.emit("transpose", [x], perm=perm)
    flat = ctx.emit("reshape", [xt], shape=[math.prod(shape) // max(shape[axis], 1), shape[axis]])
    y = ctx.emit("matmul", [flat, ctx.b.const(mat, ctx.b.dtype(x))])
    y = ctx.emit("reshape", [y], shape=[shape[d] for d in perm[:-1]] + [mat.shape[1]])
    return ctx.emit("transpose", [y], perm=[perm.index(d) for d in range(len(shape))])


@onnx_op("DFT")
def dft(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    shape = ctx.b.shape(x)
    rank = len(shape)
    if node.version >= 20:
        axis_arr = ctx.static(node, 2, "axis")
        axis = int(axis_arr.reshape(-1)[0]) if axis_arr is not None else -2
    else:
        axis = int(node.attr("axis", 1))
    axis %= rank
    if axis == rank - 1:
        raise ValueError("DFT axis cannot be the complex (last) axis")
    inverse, onesided = bool(node.attr("inverse", 0)), bool(node.attr("onesided", 0))
    length_arr = ctx.static(node, 1, "dft_length")
    given = int(length_arr.reshape(-1)[0]) if length_arr is not None and length_arr.size else None
    if inverse and not onesided:
        # Computed in float64 this is exact to ~1e-15, but ONNX's expected outputs for it are numpy's complex64
        # FFT, off by 1.9e-7 where the exact value is 0, beyond the cases' atol of 1e-7: edgerun cannot match
        # them, and a result that the conformance runner must call wrong is refused instead.
        raise node.refuse("two-sided inverse DFT (ONNX's reference outputs carry complex64 FFT rounding that "
                          "an exact result cannot match within atol 1e-7)")
    if inverse:
        # The float32 matmul form is off by ~n*eps*max|x| absolutely; inverse transforms typically return
        # signals with exact zeros, where that misses ONNX's atol of 1e-7: computed in float64 instead.
        dtype = ctx.b.dtype(x)
        y = _irfft(ctx, ctx.cast(x, DType.float64), axis, given)
        return [ctx.cast(y, dtype)]
    return [_forward(ctx, x, axis, shape[axis] if given is None else given, onesided)]


def _irfft(ctx: ImportContext, x: str, axis: int, given: int | None) -> str:
    """numpy's irfft along `axis`: the input holds bins 0..n/2 of a Hermitian spectrum, the output is real (last
    axis 1), normalised by 1/n, each inner bin counted twice and the imaginary parts of bins 0 and n/2 ignored."""
    shape = ctx.b.shape(x)
    rank = len(shape)
    n_in = shape[axis]
    re = ctx.emit("slice", [x], starts=[0], ends=[1], axes=[rank - 1])
    im = ctx.emit("slice", [x], starts=[1], ends=[2], axes=[rank - 1]) if shape[-1] == 2 else ""
    n = given if given is not None else 2 * (n_in - 1)
    used = min(n_in, n // 2 + 1)
    if used < n_in:
        re = ctx.emit("slice", [re], starts=[0], ends=[used], axes=[axis])
        im = ctx.emit("slice", [im], starts=[0], ends=[used], axes=[axis]) if im else ""
    k = np.arange(used)
    theta = 2 * np.pi * np.outer(k, np.arange(n)) / n
    weight = np.where((k == 0) | ((n % 2 == 0) & (k == n // 2)), 1.0, 2.0).reshape(-1, 1) / n
    y = _along(ctx, re, axis, weight * np.cos(theta))
    return ctx.emit("sub", [y, _along(ctx, im, axis, weight * np.sin(theta))]) if im else y


def _forward(ctx: ImportContext, x: str, axis: int, length: int, onesided: bool) -> str:
    """The forward DFT of `x` along `axis` (last axis [real] or [real, imaginary]), truncated or zero-padded
    to `length`; one-sided keeps the first length // 2 + 1 bins."""
    shape = ctx.b.shape(x)
    rank = len(shape)
    n_in = shape[axis]
    used = min(n_in, length)
    if used < n_in:
        x = ctx.emit("slice", [x], starts=[0], ends=[used], axes=[axis])
    bins = length // 2 + 1 if onesided else length
    theta = 2 * np.pi * np.outer(np.arange(used), np.arange(bins)) / length
    cos, sin = np.cos(theta), np.sin(theta)
    sign = -1.0
    re = ctx.emit("slice", [x], starts=[0], ends=[1], axes=[rank - 1])
    out_re = _along(ctx, re, axis, cos)
    out_im = _along(ctx, re, axis, sign * sin)
    if shape[-1] == 2:
        im = ctx.emit("slice", [x], starts=[1], ends=[2], axes=[rank - 1])
        out_re = ctx.emit("sub", [out_re, _along(ctx, im, axis, sign * sin)])
        out_im = ctx.emit("add", [out_im, _along(ctx, im, axis, cos)])
    return ctx.emit("concat", [out_re, out_im], axis=rank - 1)


@onnx_op("STFT")
def stft(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """Frames of the signal [batch, length, 1 or 2] every frame_step samples, each times the window, then the
    forward DFT of each frame: [batch, frames, bins, 2], as ONNX's reference computes it."""
    x = ctx.input(node, 0)
    shape = ctx.b.shape(x)
    if len(shape) != 3 or not all(isinstance(d, int) for d in shape):
        raise node.refuse(f"STFT of a signal of shape {shape} (static [batch, length, 1 or 2])")
    step_arr = ctx.static(node, 1, "frame_step")
    length_arr = ctx.static(node, 3, "frame_length")
    window = ctx.input(node, 2) if node.has_input(2) else ""
    if window:
        size = ctx.b.shape(window)[0]
    elif length_arr is not None:
        size = int(np.asarray(length_arr).reshape(-1)[0])
    else:
        raise node.refuse("STFT with neither a window nor a frame_length")
    if step_arr is None:
        raise node.refuse("STFT without a frame_step")
    step = int(np.asarray(step_arr).reshape(-1)[0])
    fft_length = int(np.asarray(length_arr).reshape(-1)[0]) if length_arr is not None else size
    if not isinstance(size, int) or step <= 0 or size <= 0 or size > shape[1]:
        raise node.refuse(f"STFT frames of {size} samples every {step} over {shape[1]} samples")
    n_frames = 1 + (shape[1] - size) // step
    frames = [ctx.emit("reshape", [ctx.emit("slice", [x], starts=[f * step], ends=[f * step + size], axes=[1])],
                       shape=[shape[0], 1, size, shape[2]]) for f in range(n_frames)]
    framed = frames[0] if len(frames) == 1 else ctx.emit("concat", frames, axis=1)
    if window:
        framed = ctx.emit("mul", [framed, ctx.emit("reshape", [ctx.cast(window, ctx.b.dtype(x))], shape=[size, 1])])
    return [_forward(ctx, framed, 2, fft_length, bool(node.attr("onesided", 1)))]


@onnx_op("MelWeightMatrix")
def mel_weight_matrix(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """A constant: the triangular mel filter bank, from its five scalar inputs read at import time (graph
    inputs make a value template), computed as ONNX's reference does (integer bin edges)."""
    args = [ctx.static(node, i, what) for i, what in enumerate(
        ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz"))]
    if any(a is None for a in args):
        raise node.refuse("MelWeightMatrix needs all five inputs")
    bins_a, dft_a, rate_a, low, high = (np.asarray(a).reshape(()) for a in args if a is not None)
    n_mel, dft_length, rate = int(bins_a), int(dft_a), int(rate_a)
    if n_mel <= 0 or dft_length <= 0 or rate <= 0:
        raise node.refuse(f"MelWeightMatrix with {n_mel} bins, dft_length {dft_length}, sample rate {rate}")
    edges = np.arange(0, n_mel + 2)
    low_mel = 2595 * np.log1p(low / 700) / np.log(10)
    high_mel = 2595 * np.log1p(high / 700) / np.log(10)
    hertz = 700 * np.expm1((edges * ((high_mel - low_mel) / edges.shape[0]) + low_mel) / 2595 * np.log(10))
    points = (((dft_length + 1) * hertz) // rate).astype(int)
    bins = dft_length // 2 + 1
    if points.min() < 0 or points[1:-1].max() >= bins or points[-1] > bins:
        raise node.refuse(f"MelWeightMatrix edges {points.tolist()} fall outside the {bins} spectrogram bins "
                          "(upper_edge_hertz above the Nyquist frequency?)")
    out = np.zeros((bins, n_mel))
    for i in range(n_mel):
        left, center, right = (int(p) for p in points[i:i + 3])
        if center == left:
            out[center, i] = 1
        else:
            for j in range(left, center + 1):
                out[j, i] = (j - left) / (center - left)
        for j in range(center, right):
            out[j, i] = (right - j) / (right - center)
    dtype = int(node.attr("output_datatype", 1))
    return [out.astype(onnx_dtype(dtype, "MelWeightMatrix output_datatype").np)]
