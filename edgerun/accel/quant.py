"""Turning float data into what an 8-bit device can compute exactly, and back.

Two quantization methods, chosen per operation by a flag:

- `SCALE` is the seed's one-pass method: each operand becomes int8 with one scale, and the output scale
  comes from the seed's rules (Eq. 4-8) so that nothing overflows. Cheap, and as lossy as 8 bits are.
- `SLICED` is how we stay within 1% of float64 on wide ranges: each operand becomes a fixed-point integer
  of up to `bits` bits (scale a power of two picked from a canary sample of the data), split into narrow
  digits (bit planes for products), every digit-pair instruction is sized so that its exact result fits the
  8-bit output (Eq. 4 with S = 1), and the host recombines the partial results in int64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgerun.errors import EdgerunError

SCALE = "SCALE"
SLICED = "SLICED"
QUANT_METHODS = (SCALE, SLICED)
CANARY_SIZE = 4096
MAX_BITS = 24  # past this, the host's int64 recombination of products could overflow


def scaling_factor(op: str, lo: float, hi: float, n: int = 1) -> float:
    """The seed's Eq. 5-8: S for an operator on data in [lo, hi] (n: the dot-product length)."""
    span = abs(hi - lo) or 1.0
    if op in ("conv2D", "FullyConnected"):
        return 1.0 / (span * span * n)  # Eq. 5
    if op in ("add", "sub"):
        return 1.0 / (2.0 * span)  # Eq. 6
    if op == "mul":
        return 1.0 / (span * span)  # Eq. 7
    return 1.0 / span  # Eq. 8


def output_requant(lo: int, hi: int) -> tuple[float, int]:
    """Eq. 4 on an integer output interval: (multiplier, zero point) onto the int8 grid.

    When the interval spans at most 256 codes the multiplier is 1 and the output is exact."""
    span = hi - lo
    if span <= 255:
        return 1.0, -128 - lo
    s = 255.0 / span
    return s, round(-128 - lo * s)


def check_finite(name: str, x: np.ndarray) -> None:
    if not np.all(np.isfinite(x)):
        raise EdgerunError(f"{name} holds NaN or infinite values; the npu computes on finite numbers only")


def canary(x: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random sample of x (the seed's canary inputs) to estimate the data range."""
    flat = x.reshape(-1)
    if flat.size <= CANARY_SIZE:
        return flat
    idx = np.random.default_rng(0x5EED).integers(0, flat.size, CANARY_SIZE)
    return flat[idx]


@dataclass
class Fixed:
    """values * 2**-frac_bits approximates the data; values fit `bits` bits (signed unless nonneg)."""

    values: np.ndarray  # int64
    frac_bits: int
    bits: int
    nonneg: bool
    canary_missed: bool = False


def _frac_bits_for(maxabs: float, bits: int, nonneg: bool) -> int:
    room = bits if nonneg else bits - 1
    if maxabs == 0:
        return 0
    return room - math.floor(math.log2(maxabs)) - 1


def to_fixed(x: np.ndarray, bits: int, *, name: str = "input", others: tuple[np.ndarray, ...] = ()) -> Fixed:
    """Fixed point for x (and a shared scale with `others`, for add/sub); integers that fit stay exact."""
    if not 2 <= bits <= MAX_BITS:
        raise EdgerunError(f"precision of {bits} bits is outside 2..{MAX_BITS}")
    arrays = (x, *others)
    for a in arrays:
        check_finite(name, a)
    sample = np.concatenate([canary(np.asarray(a, dtype=np.float64)) for a in arrays])
    nonneg = bool(all(a.size == 0 or float(a.min()) >= 0 for a in arrays))
    is_int = all(np.array_equal(a, np.rint(a)) for a in arrays)
    full_max = max(float(np.abs(a).max()) if a.size else 0.0 for a in arrays)
    if is_int:
        hi = max(int(a.max()) if a.size else 0 for a in arrays)
        lo = min(int(a.min()) if a.size else 0 for a in arrays)
        needed = max(1, hi.bit_length()) if nonneg else 1 + max(hi.bit_length(), (-lo - 1).bit_length())
        if needed <= bits:  # small integers: exact, and no more digits than they need
            return Fixed(np.asarray(x, dtype=np.int64), 0, needed, nonneg)
    frac = _frac_bits_for(float(np.abs(sample).max()) if sample.size else 0.0, bits, nonneg)
    missed = False
    limit = 2.0 ** (bits if nonneg else bits - 1)
    if full_max * 2.0**frac >= limit - 0.5:  # the canary missed the real extreme: rescale, never saturate
        frac, missed = _frac_bits_for(full_max, bits, nonneg), True
        while full_max * 2.0**frac >= limit - 0.5:
            frac -= 1
    if not math.isfinite(2.0**frac) or not math.isfinite(full_max * 2.0**frac):
        raise EdgerunError(f"{name}: a range up to {full_max:g} cannot be represented")
    values = np.rint(np.ldexp(np.asarray(x, dtype=np.float64), frac)).astype(np.int64)
    return Fixed(values, frac, bits, nonneg, missed)


@dataclass
class Digit:
    """One slice of a fixed-point tensor: values * 2**shift summed over digits gives the integers back."""

    values: np.ndarray  # int8
    shift: int
    lo: int
    hi: int


def slice_digits(fx: Fixed, width: int) -> list[Digit]:
    """Two's-complement digits of `width` bits, low first; the top digit carries the sign (if any)."""
    n = max(1, math.ceil(fx.bits / width))
    mask = (1 << width) - 1
    out = []
    for i in range(n):
        top = i == n - 1
        top_width = fx.bits - width * (n - 1)
        if top and not fx.nonneg:
            d = fx.values >> (width * i)  # arithmetic shift keeps the sign
            lo, hi = -(1 << (top_width - 1)), (1 << (top_width - 1)) - 1
        else:
            d = (fx.values >> (width * i)) & mask
            w = top_width if top else width
            lo, hi = 0, (1 << w) - 1
        out.append(Digit(d.astype(np.int8), width * i, lo, hi))
    return out


def quantize_int8(x: np.ndarray, name: str = "input") -> tuple[np.ndarray, float]:
    """SCALE method: symmetric int8 codes and the scale s with x ~= codes / s (Eq. 8 on the range)."""
    check_finite(name, x)
    # the full range, not a sample: one 8-bit pass has no headroom, and a saturated code is a silent error
    maxabs = float(np.abs(x).max()) if x.size else 0.0
    s = 127.0 / maxabs if maxabs > 0 else 1.0
    if not math.isfinite(s):
        raise EdgerunError(f"{name}: values too small to scale")
    return np.clip(np.rint(x * s), -127, 127).astype(np.int8), s
