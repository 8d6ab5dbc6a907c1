"""Weight quantizers: int8 per output channel (symmetric) and int4 per group along K (packed two per byte)."""

from __future__ import annotations

import numpy as np

from edgerun.oracle.quant_kernels import pack_int4, quantize_values


def int8_per_channel(w: np.ndarray, axis: int, qmax: int = 127) -> tuple[np.ndarray, np.ndarray]:
    """(int8 weight, float32 scale per channel along `axis`): symmetric, q in [-qmax, qmax], zero point 0.

    qmax 63 (7 bits, "reduce range") is what ONNX Runtime's uint8 x int8 AVX2 kernel needs to stay exact.
    """
    reduce = tuple(i for i in range(w.ndim) if i != axis % w.ndim)
    amax = np.max(np.abs(w), axis=reduce, keepdims=True).astype(np.float32)
    scale = np.where(amax > 0, amax / np.float32(qmax), np.float32(1)).astype(np.float32)
    q = np.clip(quantize_values(w.astype(np.float32), scale, np.zeros(scale.shape, np.int8)), -qmax, qmax)
    return q.astype(np.int8), scale.reshape(-1)


def int4_groups(w_kn: np.ndarray, group: int, symmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A [K, N] weight as matmul_int4 operands: packed uint8 [N, blocks, group/2], scales and zero points [N, blocks].

    Asymmetric: each group's [min, max] maps onto 0..15 (ONNX Runtime's MatMulNBits quantizer). Symmetric
    (ExecuTorch's 8da4w): scale = max|w| / 7.5 ... stored as q + 8 in 0..15 with zero point 8.
    K is padded with zeros to whole groups.
    """
    k, n = w_kn.shape
    blocks = -(-k // group)
    wg = np.zeros((n, blocks * group), np.float32)
    wg[:, :k] = w_kn.T
    wg = wg.reshape(n, blocks, group)
    if symmetric:
        amax = np.abs(wg).max(axis=2)
        scale = np.where(amax > 0, amax / np.float32(7.5), np.float32(1)).astype(np.float32)
        zp = np.full((n, blocks), 8, np.uint8)
    else:
        lo, hi = np.minimum(wg.min(axis=2), 0), np.maximum(wg.max(axis=2), 0)
        scale = np.where(hi > lo, (hi - lo) / np.float32(15), np.float32(1)).astype(np.float32)
        zp = np.clip(np.rint(-lo / scale), 0, 15).astype(np.uint8)
    q = np.clip(np.rint(wg / scale[:, :, None]) + zp[:, :, None], 0, 15).astype(np.uint8)
    return pack_int4(q), scale, zp
