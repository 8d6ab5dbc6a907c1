"""LU decomposition (no pivoting) by recursion on quadrants: crop partitions, tpuGemm does the products.

    [A11 A12]   [L11  0 ] [U11 U12]      U12 = inv(L11) A12,  L21 = A21 inv(U11),
    [A21 A22] = [L21 L22] [ 0  U22]      L22 U22 = LU(A22 - L21 U12)

The triangular inverses recurse the same way (their off-diagonal blocks are two products each), so every
product above the base size runs on the npu. Output: L (unit diagonal, strictly lower part) and U packed
into one matrix, as Rodinia's lud writes it.
"""

from __future__ import annotations

import numpy as np

from edgerun.accel.apps.common import App, Data, uniform
from edgerun.accel.runtime import Runtime

BASE = 16  # blocks this small are factored on the host


def make(n: int, rng: np.random.Generator, value_range: tuple[float, float] | None) -> Data:
    r = value_range or (0.0, 1.0)
    a = uniform(rng, (n, n), r)
    a[np.diag_indices(n)] += n * max(abs(r[0]), abs(r[1]))  # diagonally dominant: stable without pivoting
    return {"a": a}


def lu_host(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    for k in range(a.shape[0] - 1):
        a[k + 1:, k] /= a[k, k]
        a[k + 1:, k + 1:] -= np.outer(a[k + 1:, k], a[k, k + 1:])
    return a


def reference(d: Data) -> np.ndarray:
    return lu_host(d["a"])


def _inv_lower(rt: Runtime, lo: np.ndarray) -> np.ndarray:
    """Inverse of a lower-triangular matrix: [[A,0],[B,C]]^-1 = [[A^-1, 0], [-C^-1 B A^-1, C^-1]]."""
    n = lo.shape[0]
    if n <= BASE:
        return np.linalg.inv(lo)
    h = n // 2
    ia, ic = _inv_lower(rt, lo[:h, :h]), _inv_lower(rt, lo[h:, h:])
    out = np.zeros_like(lo)
    out[:h, :h], out[h:, h:] = ia, ic
    out[h:, :h] = -rt.gemm(ic, rt.gemm(lo[h:, :h], ia))
    return out


def _lu(rt: Runtime, a: np.ndarray) -> np.ndarray:
    n = a.shape[0]
    if n <= BASE:
        return lu_host(a)
    h = n // 2
    a11 = rt.run("crop", a, box=(0, 0, h, h))
    a12 = rt.run("crop", a, box=(0, h, h, n - h))
    a21 = rt.run("crop", a, box=(h, 0, n - h, h))
    a22 = rt.run("crop", a, box=(h, h, n - h, n - h))
    f11 = _lu(rt, a11)
    l11 = np.tril(f11, -1) + np.eye(h)
    u11 = np.triu(f11)
    u12 = rt.gemm(_inv_lower(rt, l11), a12)
    l21 = rt.gemm(a21, _inv_lower(rt, u11.T).T)
    f22 = _lu(rt, a22 - rt.gemm(l21, u12))
    return np.block([[f11, u12], [l21, f22]])


def on_npu(rt: Runtime, d: Data) -> np.ndarray:
    return _lu(rt, d["a"])


APP = App("lud", make, reference, on_npu, f"recursive LU, host base case {BASE}x{BASE}")
