"""Tensorizer: one requested operation -> device instructions on good shapes, plus the host code that
recombines their int8 outputs into the float64 result.

Rules (the seed's Section 6.2): products (conv2D, FullyConnected) are blocked GEMMs on 128x128 output tiles
with the host accumulating partial products in int64; pair-wise and element-wise ops run on 128x128 tiles;
mean and max on 64x64 tiles with host aggregation. Operands are written straight into device layouts
(`modelfile` for the byte format); no ML framework is involved.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

from edgerun.accel.costmodel import OPERATORS
from edgerun.accel.device import Instruction
from edgerun.accel.quant import (
    SCALE,
    SLICED,
    Digit,
    Fixed,
    check_finite,
    output_requant,
    quantize_int8,
    scaling_factor,
    slice_digits,
    to_fixed,
)
from edgerun.errors import EdgerunError

TILE = 128
REDUCE_TILE = 64
MAC_WIDTH = 1  # bit planes: a K-block of 255 plane products still fits one 8-bit output
ADD_WIDTH = 7  # digit sums and differences fit 8 bits
MUL_WIDTH = 4  # 4-bit digit products fit 8 bits
MODEL_DIGITS = 4  # model digits per product instruction: bounds its output (<= 1 MB) and spreads the work


@dataclass
class Plan:
    instructions: list[Instruction]
    finish: Callable[[list[np.ndarray]], np.ndarray]


def _acc(q: np.ndarray, zp: int) -> np.ndarray:
    return q.astype(np.int64) - zp


def _sum_bits(fa: Fixed, fb: Fixed, k: int) -> int:
    return fa.bits + fb.bits + max(1, math.ceil(math.log2(k + 1)))


def _class_groups(digits: list[Digit], chunk: int = 0) -> list[list[int]]:
    """Digits with the same value range, so one instruction (one zero point) serves them together; with
    `chunk`, at most that many per group (smaller outputs, more instructions for more devices)."""
    groups: dict[tuple[int, int], list[int]] = {}
    for i, d in enumerate(digits):
        groups.setdefault((d.lo, d.hi), []).append(i)
    if not chunk:
        return list(groups.values())
    return [g[i:i + chunk] for g in groups.values() for i in range(0, len(g), chunk)]


def _mac_interval(da: Digit, db: Digit, k: int) -> tuple[int, int]:
    prods = [da.lo * db.lo, da.lo * db.hi, da.hi * db.lo, da.hi * db.hi]
    return k * min(0, min(prods)), k * max(0, max(prods))


def _recombine_int(total: np.ndarray, frac: int) -> np.ndarray:
    return np.ldexp(total.astype(np.float64), -frac)


# ---- products: GEMM as strided conv2D or FullyConnected, and the small-kernel stencil ---------------------

def gemm_plan(a: np.ndarray, b: np.ndarray, *, method: str, flags: str, bits: int, key: Hashable) -> Plan:
    """C = A @ B. method 'conv2D' (the seed's strided-convolution layout) or 'FullyConnected'."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise EdgerunError(f"GEMM wants (M, K) @ (K, N), got {a.shape} @ {b.shape}")
    check_finite("A", a)
    check_finite("B", b)
    m, kdim = a.shape
    n = b.shape[1]
    if min(m, kdim, n) == 0:  # nothing for the device to do: numpy's answer
        return Plan([], lambda outs: np.zeros((m, n)))
    bound = float(np.abs(a).max(initial=0)) * float(np.abs(b).max(initial=0)) * kdim
    if not math.isfinite(bound):
        raise EdgerunError(f"GEMM of {a.shape} @ {b.shape}: products of this range overflow float64")
    if flags == SCALE:
        qa, sa = quantize_int8(a, "A")
        qb, sb = quantize_int8(b, "B")
        digits_a = [Digit(qa, 0, -127, 127)]
        digits_b = [Digit(qb, 0, -127, 127)]
        frac_scale = 1.0 / (sa * sb)
        mult = 127.0 * scaling_factor("conv2D", 0, 127, min(kdim, TILE))  # Eq. 5 on the codes' magnitudes
        return _mac_plan(digits_a, digits_b, m, kdim, n, method, key, kblock=TILE, scale_out=(mult, 0),
                         finish_scale=frac_scale, exact=False)
    fa, fb = to_fixed(a, bits, name="A"), to_fixed(b, bits, name="B")
    da, db = slice_digits(fa, MAC_WIDTH), slice_digits(fb, MAC_WIDTH)
    unit = max(hi - lo for x in da for y in db for lo, hi in [_mac_interval(x, y, 1)])
    kblock = max(1, min(kdim, 255 // max(1, unit)))
    kblock = math.ceil(kdim / math.ceil(kdim / kblock))  # even blocks
    return _mac_plan(da, db, m, kdim, n, method, key, kblock=kblock, scale_out=None,
                     finish_scale=2.0 ** -(fa.frac_bits + fb.frac_bits), exact=True,
                     total_bits=_sum_bits(fa, fb, kdim))


def _mac_plan(da: list[Digit], db: list[Digit], m: int, kdim: int, n: int, method: str, key: Hashable, *,
              kblock: int, scale_out: tuple[float, int] | None, finish_scale: float, exact: bool,
              total_bits: int = 0) -> Plan:
    if method not in ("conv2D", "FullyConnected"):
        raise EdgerunError(f"GEMM method must be conv2D or FullyConnected, got {method!r}")
    ga, gb = _class_groups(da), _class_groups(db, MODEL_DIGITS)
    instructions: list[Instruction] = []
    places: list[tuple[int, int, list[int], list[int], int, float]] = []
    for r0, c0, k0 in itertools.product(range(0, m, TILE), range(0, n, TILE), range(0, kdim, kblock)):
        mt, nt, kt = min(TILE, m - r0), min(TILE, n - c0), min(kblock, kdim - k0)
        for ia, ib in itertools.product(range(len(ga)), range(len(gb))):
            ia_idx, ib_idx = ga[ia], gb[ib]
            a_blk = np.stack([da[i].values[r0:r0 + mt, k0:k0 + kt] for i in ia_idx])  # (na, mt, kt)
            b_blk = np.stack([db[j].values[k0:k0 + kt, c0:c0 + nt] for j in ib_idx])  # (nb, kt, nt)
            if scale_out is None:
                mult, zp = output_requant(*_mac_interval(da[ia_idx[0]], db[ib_idx[0]], kt))
            else:
                mult, zp = scale_out
            a_key = (key, "A", r0, k0, ia)
            b_key = (key, "B", c0, k0, ib)
            if method == "conv2D":
                img, filt, s = conv2d_gemm_layout(a_blk, b_blk)
                ops = ((a_key, img), (b_key, filt))
                params: dict[str, Any] = {"stride": (s, s)}
            else:
                ops = ((a_key, a_blk.reshape(-1, kt)), (b_key, b_blk.transpose(1, 0, 2).reshape(kt, -1)))
                params = {}
            instructions.append(Instruction(method, ops, params, mult, zp, exact, affinity=b_key))
            places.append((r0, c0, ia_idx, ib_idx, zp, mult))

    # the host's accumulation of partial products: exact in float64 while every sum stays below 2^53
    dtype: type[np.floating[Any]] | type[np.signedinteger[Any]] = (
        np.float64 if (not exact or total_bits <= 52) else np.int64)

    def finish(outs: list[np.ndarray]) -> np.ndarray:
        total = np.zeros((m, n), dtype=dtype)
        for q, (r0, c0, ia_idx, ib_idx, zp, mult) in zip(outs, places):
            na, nb = len(ia_idx), len(ib_idx)
            mt, nt = min(TILE, m - r0), min(TILE, n - c0)
            acc = (q.astype(dtype) - zp).reshape(na, mt * nb * nt)
            if not exact:
                acc = acc / mult
            wa = np.array([1 << da[i].shift for i in ia_idx], dtype=dtype)
            wb = np.array([1 << db[j].shift for j in ib_idx], dtype=dtype)
            part = (wa @ acc).reshape(mt, nb, nt)
            total[r0:r0 + mt, c0:c0 + nt] += np.einsum("mjn,j->mn", part, wb)
        return total.astype(np.float64) * finish_scale

    return Plan(instructions, finish)


def conv2d_gemm_layout(a_blk: np.ndarray, b_blk: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The seed's GEMM-as-conv2D layout: each row of A becomes an s x s patch (s = ceil(sqrt(K))), each column
    of B an s x s kernel; conv2D at stride (s, s) then yields exactly A @ B. Batch = A's digits, output
    channels = B's digits x columns."""
    na, mt, kt = a_blk.shape
    nb, _, nt = b_blk.shape
    s = math.ceil(math.sqrt(kt))
    pad = s * s - kt
    a_p = np.pad(a_blk, ((0, 0), (0, 0), (0, pad))) if pad else a_blk
    img = a_p.reshape(na, mt, s, s).reshape(na, mt * s, s, 1)  # patch grid: mt rows x 1 column
    b_p = np.pad(b_blk, ((0, 0), (0, pad), (0, 0))) if pad else b_blk
    filt = b_p.reshape(nb, s, s, nt).transpose(1, 2, 0, 3).reshape(s, s, 1, nb * nt)
    return np.ascontiguousarray(img), np.ascontiguousarray(filt), s


def stencil_plan(x: np.ndarray, w: np.ndarray, *, flags: str, bits: int, key: Hashable) -> Plan:
    """VALID conv2D of x (H, W, C) with a small kernel w (kh, kw, C), stride 1: HotSpot's stencil."""
    if x.ndim != 3 or w.ndim != 3 or x.shape[2] != w.shape[2]:
        raise EdgerunError(f"stencil wants (H, W, C) data and a (kh, kw, C) kernel, got {x.shape} and {w.shape}")
    check_finite("stencil input", x)
    check_finite("stencil kernel", w)
    kh, kw, c = w.shape
    ho, wo = x.shape[0] - kh + 1, x.shape[1] - kw + 1
    if ho < 1 or wo < 1:
        raise EdgerunError(f"stencil kernel {kh}x{kw} is larger than its input {x.shape[:2]}")
    taps = kh * kw * c
    if flags == SCALE:
        qx, sx = quantize_int8(x, "stencil input")
        qw, sw = quantize_int8(w, "stencil kernel")
        dx, dw = [Digit(qx, 0, -127, 127)], [Digit(qw, 0, -127, 127)]
        mult = 127.0 * scaling_factor("conv2D", 0, 127, taps)
        scale_fin, exact, fixed_scale = 1.0 / (sx * sw), False, (mult, 0)
    else:
        fx, fw = to_fixed(x, bits, name="stencil input"), to_fixed(w, bits, name="stencil kernel")
        dx, dw = slice_digits(fx, MAC_WIDTH), slice_digits(fw, MAC_WIDTH)
        scale_fin, exact, fixed_scale = 2.0 ** -(fx.frac_bits + fw.frac_bits), True, None
    gx, gw = _class_groups(dx), _class_groups(dw, MODEL_DIGITS)
    instructions, places = [], []
    for r0, c0 in itertools.product(range(0, ho, TILE), range(0, wo, TILE)):
        th, tw = min(TILE, ho - r0), min(TILE, wo - c0)
        for ix, iw in itertools.product(range(len(gx)), range(len(gw))):
            xi, wi = gx[ix], gw[iw]
            img = np.stack([dx[i].values[r0:r0 + th + kh - 1, c0:c0 + tw + kw - 1] for i in xi])
            filt = np.stack([dw[j].values for j in wi], axis=-1)  # kh, kw, C, nw
            if fixed_scale is None:
                mult, zp = output_requant(*_mac_interval(dx[xi[0]], dw[wi[0]], taps))
            else:
                mult, zp = fixed_scale
            ops = (((key, "X", r0, c0, ix), np.ascontiguousarray(img)), ((key, "W", iw), np.ascontiguousarray(filt)))
            instructions.append(Instruction("conv2D", ops, {"stride": (1, 1)}, mult, zp, exact,
                                            affinity=(key, "W", iw, r0, c0)))
            places.append((r0, c0, th, tw, xi, wi, zp, mult))

    def finish(outs: list[np.ndarray]) -> np.ndarray:
        total = np.zeros((ho, wo), dtype=np.int64 if exact else np.float64)
        for q, (r0, c0, th, tw, xi, wi, zp, mult) in zip(outs, places):
            acc = _acc(q, zp)  # (nx, th, tw, nw)
            if not exact:
                acc = acc / mult
            wx = np.array([1 << dx[i].shift for i in xi], dtype=acc.dtype)
            ww = np.array([1 << dw[j].shift for j in wi], dtype=acc.dtype)
            total[r0:r0 + th, c0:c0 + tw] += np.einsum("ihwj,i,j->hw", acc, wx, ww).astype(total.dtype)
        return total.astype(np.float64) * scale_fin

    return Plan(instructions, finish)


# ---- pair-wise and element-wise ops on 128x128 tiles -------------------------------------------------------

def _tiles2d(shape: tuple[int, int], tile: int) -> list[tuple[int, int, int, int]]:
    h, w = shape
    return [(r, c, min(tile, h - r), min(tile, w - c)) for r in range(0, h, tile) for c in range(0, w, tile)]


def _as2d(x: np.ndarray) -> np.ndarray:
    if x.ndim == 1:  # a vector is laid out as rows of one tile width, zero-padded (the caller drops the pad)
        rows = -(-x.size // TILE) if x.size > TILE else 1
        width = TILE if x.size > TILE else x.size
        return np.pad(x, (0, rows * width - x.size)).reshape(rows, width)
    if x.ndim != 2:
        raise EdgerunError(f"the npu's tensor ops take 1-D or 2-D data, got shape {x.shape}")
    return x


def pairwise_plan(op: str, a: np.ndarray, b: np.ndarray, *, flags: str, bits: int, key: Hashable) -> Plan:
    """add, sub, mul of two same-shaped arrays."""
    if a.shape != b.shape:
        raise EdgerunError(f"{op} wants operands of one shape, got {a.shape} and {b.shape}")
    shape = a.shape
    a2, b2 = _as2d(a), _as2d(b)
    check_finite(f"{op} input", a2)
    check_finite(f"{op} input", b2)
    if flags == SCALE:
        qa, sa = quantize_int8(a2)
        qb, sb = quantize_int8(b2)
        if op in ("add", "sub"):
            s = min(sa, sb)  # one scale for both, so codes add
            qa, qb = np.rint(a2 * s).astype(np.int8), np.rint(b2 * s).astype(np.int8)
            mult, fin = 127.0 * scaling_factor(op, 0, 127), 1.0 / s
        else:
            mult, fin = 127.0 * scaling_factor("mul", 0, 127), 1.0 / (sa * sb)
        pairs = [(Digit(qa, 0, -127, 127), Digit(qb, 0, -127, 127))]
        exact = False
    elif op == "mul":
        fa, fb = to_fixed(a2, bits, name="mul input"), to_fixed(b2, bits, name="mul input")
        pairs = list(itertools.product(slice_digits(fa, MUL_WIDTH), slice_digits(fb, MUL_WIDTH)))
        fin, exact, mult = 2.0 ** -(fa.frac_bits + fb.frac_bits), True, 1.0
    else:
        fa = to_fixed(a2, bits, name=f"{op} input", others=(b2,))
        fb = to_fixed(b2, bits, name=f"{op} input", others=(a2,))
        pairs = list(zip(slice_digits(fa, ADD_WIDTH), slice_digits(fb, ADD_WIDTH)))
        fin, exact, mult = 2.0 ** -fa.frac_bits, True, 1.0
    instructions, places = [], []
    for p, (x, y) in enumerate(pairs):
        if exact:
            cands = [{"add": u + v, "sub": u - v, "mul": u * v}[op] for u in (x.lo, x.hi) for v in (y.lo, y.hi)]
            mult, zp = output_requant(min(cands), max(cands))
        else:
            zp = 0
        for r, c, h, w in _tiles2d(a2.shape, TILE):
            ops = (((key, "a", p, r, c), x.values[r:r + h, c:c + w]), ((key, "b", p, r, c), y.values[r:r + h, c:c + w]))
            instructions.append(Instruction(op, ops, {}, mult, zp, exact, affinity=(key, "a", p, r, c)))
            places.append((r, c, h, w, x.shift + (y.shift if op == "mul" else 0), zp, mult))

    def finish(outs: list[np.ndarray]) -> np.ndarray:
        total: np.ndarray = np.zeros(a2.shape, dtype=np.int64 if exact else np.float64)
        for q, (r, c, h, w, shift, zp, mult) in zip(outs, places):
            acc = _acc(q, zp)
            if exact:
                total[r:r + h, c:c + w] += acc << shift
            else:
                total[r:r + h, c:c + w] += acc / mult
        return (total.astype(np.float64) * fin).reshape(-1)[: int(np.prod(shape))].reshape(shape)

    return Plan(instructions, finish)


def elementwise_plan(op: str, a: np.ndarray, *, key: Hashable) -> Plan:
    """tanh and ReLU: one 8-bit pass (the device has no wider path for them)."""
    a2 = _as2d(a)
    q, s = quantize_int8(a2, f"{op} input")
    instructions, places = [], []
    for r, c, h, w in _tiles2d(a2.shape, TILE):
        params = {"input_scale": 1.0 / s} if op == "tanh" else {}
        instructions.append(Instruction(op, (((key, r, c), q[r:r + h, c:c + w]),), params))
        places.append((r, c, h, w))
    out_scale = 1.0 / 127.0 if op == "tanh" else 1.0 / s

    def finish(outs: list[np.ndarray]) -> np.ndarray:
        total = np.zeros(a2.shape)
        for o, (r, c, h, w) in zip(outs, places):
            total[r:r + h, c:c + w] = o.astype(np.float64) * out_scale
        return total.reshape(-1)[: a.size].reshape(a.shape)

    return Plan(instructions, finish)


def reduce_plan(op: str, a: np.ndarray, *, key: Hashable) -> Plan:
    """mean and max: one instruction per 64x64 tile, the host aggregates the per-tile results."""
    a2 = _as2d(a)
    if a2.size == 0:
        raise EdgerunError(f"{op} of an empty array")
    q, s = quantize_int8(a2, f"{op} input")
    tiles = _tiles2d(a2.shape, REDUCE_TILE)
    instructions = [Instruction(op, (((key, r, c), q[r:r + h, c:c + w]),), {}, 1.0, 0) for r, c, h, w in tiles]

    def finish(outs: list[np.ndarray]) -> np.ndarray:
        vals = np.array([float(o) for o in outs]) / s
        if op == "max":
            return np.array(vals.max())
        sizes = np.array([h * w for _, _, h, w in tiles], dtype=np.float64)
        return np.array(float((vals * sizes).sum() / sizes.sum()))

    return Plan(instructions, finish)


def move_plan(op: str, a: np.ndarray, *, key: Hashable, **params: Any) -> Plan:
    """crop (box = (r0, c0, h, w)) and ext (zero-pad to shape = (H, W)) of a 2-D array: pure data movement,
    so the float64 bytes travel as int8 (8 per value, exact) and no scale is involved."""
    if a.ndim != 2:
        raise EdgerunError(f"{op} takes a 2-D array, got shape {a.shape}")
    data = np.ascontiguousarray(a, dtype="<f8").view(np.int8)  # (H, W * 8)
    if op == "crop":
        r0, c0, h, w = params["box"]
        if r0 < 0 or c0 < 0 or h < 1 or w < 1 or r0 + h > a.shape[0] or c0 + w > a.shape[1]:
            raise EdgerunError(f"crop box {params['box']} is outside an array of shape {a.shape}")
        dev_params: dict[str, Any] = {"box": (r0, c0 * 8, h, w * 8)}
    else:
        h, w = params["shape"]
        if h < a.shape[0] or w < a.shape[1]:
            raise EdgerunError(f"ext to {(h, w)} would shrink an array of shape {a.shape}")
        dev_params = {"shape": (h, w * 8)}
    ins = Instruction(op, ((key, data),), dev_params)

    def finish(outs: list[np.ndarray]) -> np.ndarray:
        return np.ascontiguousarray(outs[0]).view("<f8").astype(np.float64)

    return Plan([ins], finish)


def plan_operation(op: str, flags: str, arrays: tuple[np.ndarray, ...], params: dict[str, Any], *, bits: int,
                   key: Hashable) -> Plan:
    """The Tensorizer's entry: an OpenCtpu operator request -> instructions and the host recombination."""
    if flags not in (SCALE, SLICED):
        raise EdgerunError(f"unknown quantization method {flags!r}; use SCALE or SLICED")
    arrays = tuple(np.asarray(x, dtype=np.float64) for x in arrays)
    want = {"conv2D": 2, "FullyConnected": 2, "add": 2, "sub": 2, "mul": 2}.get(op, 1)
    if op not in OPERATORS:
        raise EdgerunError(f"unknown npu operator {op!r}; the device runs {', '.join(sorted(OPERATORS))}")
    if len(arrays) != want:
        raise EdgerunError(f"{op} takes {want} input(s), got {len(arrays)}")
    if op == "conv2D" and params.get("mode") == "stencil":
        return stencil_plan(arrays[0], arrays[1], flags=flags, bits=bits, key=key)
    if op in ("conv2D", "FullyConnected"):
        a, b = arrays
        vector = a.ndim == 1
        plan = gemm_plan(a.reshape(1, -1) if vector else a, b, method=op, flags=flags, bits=bits, key=key)
        if vector:
            inner = plan.finish
            plan.finish = lambda outs: inner(outs).reshape(-1)
        return plan
    if op in ("add", "sub", "mul"):
        return pairwise_plan(op, arrays[0], arrays[1], flags=flags, bits=bits, key=key)
    if op in ("tanh", "ReLU"):
        return elementwise_plan(op, arrays[0], key=key)
    if op in ("mean", "max"):
        return reduce_plan(op, arrays[0], key=key)
    check_finite(f"{op} input", arrays[0])
    return move_plan(op, arrays[0], key=key, **params)
