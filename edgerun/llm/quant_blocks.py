"""GGUF block formats unpacked into packed group-wise arrays, and their exact float32 dequantisation.

GGUF stores a quantized row as blocks of 32 values: a float16 scale `d` (and for Q4_1 a float16 minimum `m`)
followed by the codes. We keep the codes packed (two 4-bit codes per byte, or one int8 per value) with one
float32 scale (and minimum) per group of 32 along the row: the group-wise int4/int8 representation the
quantized IR takes, so the program can carry weights as the GGUF had them once packed kernels exist.

value = scale * code + min   (Q4_1: code 0..15; Q4_0: code 0..15, min = -8 * scale; Q8_0: code int8, no min)

The float32 arithmetic is the same as gguf's own `gguf.quants.dequantize` (checked bit for bit in the tests):
d*q with q <= 15 and d a float16 is exact in float32, so adding the minimum rounds once, as theirs does.

Q4_K is read into the q4_1 form: its 256-value super-blocks hold eight sub-blocks of 32 with a 6-bit scale
and a 6-bit minimum each, under a float16 `d` and `dmin`, and `d*sc*q - dmin*m` is exactly `scale * code +
min` with scale = d*sc and min = -(dmin*m), both exact in float32 (11 + 6 significant bits), so the q4_1
kernels run it and gguf's own dequantizer's bits come out (tests/llm/test_gguf.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgerun.errors import EdgerunError

GROUP = 32  # values per block (per scale) in every format we read

# scheme -> bytes per 32-value block
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34}
SUPER_BLOCK = 256  # values per Q4_K super-block
Q4_K_BYTES = 144  # float16 d and dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of codes


@dataclass(frozen=True)
class PackedWeight:
    """A row-major [rows, cols] matrix quantized in groups of 32 along each row (rows = output features)."""

    scheme: str  # "q4_0" | "q4_1" | "q8_0": the packed form (a Q4_K tensor is read into "q4_1")
    shape: tuple[int, int]
    data: np.ndarray  # q4: uint8 [rows, cols//2], byte k = element 2k (low nibble) | element 2k+1 (high)
    scales: np.ndarray  # float32 [rows, cols//32]
    mins: np.ndarray | None  # float32 [rows, cols//32]; None for q8_0

    @property
    def bits(self) -> int:
        return 8 if self.scheme == "q8_0" else 4

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.scales.nbytes + (self.mins.nbytes if self.mins is not None else 0))

    def codes(self) -> np.ndarray:
        """The integer codes, one per element: uint8 0..15 for 4-bit schemes, int8 for q8_0."""
        if self.bits == 8:
            return self.data
        rows, cols = self.shape
        out = np.empty((rows, cols), np.uint8)
        out[:, 0::2] = self.data & 0x0F
        out[:, 1::2] = self.data >> 4
        return out

    def dequantize(self) -> np.ndarray:
        rows, cols = self.shape
        codes = self.codes().reshape(rows, cols // GROUP, GROUP).astype(np.float32)
        values = codes * self.scales[:, :, None]
        if self.mins is not None:
            values += self.mins[:, :, None]
        return values.reshape(rows, cols)

    @staticmethod
    def stack(weights: list[PackedWeight]) -> PackedWeight:
        """The matrices one above the other (same scheme and row length): one matmul for several."""
        first = weights[0]
        if any(w.scheme != first.scheme or w.shape[1] != first.shape[1] for w in weights):
            raise EdgerunError("only weights of one scheme and row length stack")
        mins = None if first.mins is None else np.concatenate([w.mins for w in weights if w.mins is not None])
        return PackedWeight(first.scheme, (sum(w.shape[0] for w in weights), first.shape[1]),
                            np.concatenate([w.data for w in weights]), np.concatenate([w.scales for w in weights]),
                            mins)

    def take_rows(self, order: np.ndarray) -> PackedWeight:
        """The same matrix with its rows reordered (groups run along rows, so they move intact)."""
        return PackedWeight(self.scheme, self.shape, self.data[order], self.scales[order],
                            None if self.mins is None else self.mins[order])


def two_per_byte(codes: np.ndarray) -> np.ndarray:
    """4-bit codes [rows, cols] (0..15, in element order) packed two per byte, the even element in the low
    nibble: PackedWeight.data's layout."""
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def unpack_blocks(scheme: str, raw: np.ndarray, shape: tuple[int, int]) -> PackedWeight:
    """Split GGUF blocks `raw` (uint8 [rows, bytes per row]) of a [rows, cols] matrix into a PackedWeight."""
    rows, cols = shape
    if cols % GROUP:
        raise EdgerunError(f"{scheme} row length {cols} is not a multiple of {GROUP}")
    per_block = BLOCK_BYTES[scheme]
    groups = cols // GROUP
    if raw.dtype != np.uint8 or raw.size != rows * groups * per_block:
        raise EdgerunError(f"{scheme} tensor of shape {shape} needs {rows * groups * per_block} bytes, "
                           f"got {raw.size}")
    blocks = np.ascontiguousarray(raw).reshape(rows, groups, per_block)
    scales = blocks[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    if scheme == "q8_0":
        codes = blocks[:, :, 2:].copy().view(np.int8).reshape(rows, cols)
        return PackedWeight(scheme, shape, codes, scales, None)
    start = 4 if scheme == "q4_1" else 2
    mins = (blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32) if scheme == "q4_1"
            else np.float32(-8.0) * scales)
    qs = blocks[:, :, start:]  # [rows, groups, 16]: low nibbles hold elements 0..15, high nibbles 16..31
    low, high = qs & 0x0F, qs >> 4
    ordered = np.concatenate([low, high], axis=2).reshape(rows, cols)  # element order
    return PackedWeight(scheme, shape, two_per_byte(ordered), scales, mins)


def unpack_q4_k(raw: np.ndarray, shape: tuple[int, int]) -> PackedWeight:
    """Q4_K super-blocks `raw` (uint8 [rows, bytes per row]) of a [rows, cols] matrix in the q4_1 form."""
    rows, cols = shape
    if cols % SUPER_BLOCK:
        raise EdgerunError(f"Q4_K row length {cols} is not a multiple of {SUPER_BLOCK}")
    supers = cols // SUPER_BLOCK
    if raw.dtype != np.uint8 or raw.size != rows * supers * Q4_K_BYTES:
        raise EdgerunError(f"Q4_K tensor of shape {shape} needs {rows * supers * Q4_K_BYTES} bytes, got {raw.size}")
    blocks = np.ascontiguousarray(raw).reshape(rows, supers, Q4_K_BYTES)
    d = blocks[:, :, 0:2].copy().view(np.float16).astype(np.float32)  # [rows, supers, 1]
    dmin = blocks[:, :, 2:4].copy().view(np.float16).astype(np.float32)
    # The eight 6-bit scales and minimums (llama.cpp's get_scale_min_k4): sub-blocks 0-3 in the low six bits
    # of bytes 0-3 (scales) and 4-7 (minimums), sub-blocks 4-7 in the nibbles of bytes 8-11 with their top
    # two bits in the spare bits of bytes 0-7.
    packed = blocks[:, :, 4:16].reshape(rows, supers, 3, 4)
    lo, mid, hi = packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]
    sc = np.concatenate([lo & 0x3F, (hi & 0x0F) | ((lo >> 2) & 0x30)], axis=2)  # [rows, supers, 8]
    mn = np.concatenate([mid & 0x3F, (hi >> 4) | ((mid >> 2) & 0x30)], axis=2)
    scales = (d * sc.astype(np.float32)).reshape(rows, cols // GROUP)
    mins = -(dmin * mn.astype(np.float32)).reshape(rows, cols // GROUP)
    # Codes: four 32-byte chunks per super-block, each the low nibbles of sub-block 2c and the high of 2c+1.
    qs = blocks[:, :, 16:].reshape(rows, supers, 4, 1, 32)
    ordered = ((qs >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)) & 0x0F).reshape(rows, cols)
    return PackedWeight("q4_1", shape, two_per_byte(ordered), scales.astype(np.float32), mins.astype(np.float32))


@dataclass
class Int4Operands:
    """matmul_int4's weight operands, plus what the int4 form cannot hold.

    w = (code - zero) * scale + offset, per group of 32 along K; x @ w.T is matmul_int4(x, packed, scales,
    zeros) plus (x summed per group) @ offsets.T, a [K/32]-wide float matmul, when there are offsets.
    """

    packed: np.ndarray  # uint8 [N, K/32, 16]
    scales: np.ndarray  # float32 [N, K/32]
    zeros: np.ndarray | None  # uint8 [N, K/32]; None means 8
    offsets: np.ndarray | None = None  # float32 [N, K/32]
    offsets_t: np.ndarray | None = None  # offsets.T, contiguous, made once by the program builder


def int4_operands(w: PackedWeight) -> Int4Operands:
    """The IR's int4 form of a Q4_0/Q4_1 weight, codes untouched (the bytes the GGUF had, re-ordered).

    Q4_0 is exactly matmul_int4's default form (zero point 8). Q4_1's `scale * code + min` is written
    `scale * (code - 8) + (min + 8 * scale)`: the int4 matmul at the default zero point plus a per-group
    offset term. Not a float zero point `-min / scale`: ONNX Runtime's MatMulNBits runs float zero points
    about 10x slower than integer ones (bench figures in docs/llm.md), and a zero scale would need care.
    """
    if w.bits != 4:
        raise EdgerunError(f"{w.scheme} is not a 4-bit scheme")
    rows, cols = w.shape
    packed = np.ascontiguousarray(w.data.reshape(rows, cols // GROUP, GROUP // 2))
    if w.scheme == "q4_0":
        return Int4Operands(packed, w.scales, None)
    assert w.mins is not None
    return Int4Operands(packed, w.scales, None, (w.mins + np.float32(8) * w.scales).astype(np.float32))


def int8_as_two_int4(w: PackedWeight) -> tuple[Int4Operands, Int4Operands]:
    """A Q8_0 weight as the sum of two int4 matmuls over its high and low nibbles, the same bytes in all.

    code + 128 = 16 * high + low with high, low in 0..15, so scale * code = (16 * scale) * (high - 8) +
    scale * (low - 0): exact in the integers, one extra float32 rounding in the sum.
    """
    if w.scheme != "q8_0":
        raise EdgerunError(f"{w.scheme} is not q8_0")
    rows, cols = w.shape
    groups = cols // GROUP
    biased = (w.data.astype(np.int16) + 128).astype(np.uint8)  # [rows, cols] in 0..255
    high, low = biased >> 4, biased & 0x0F
    pack = lambda v: two_per_byte(v).reshape(rows, groups, GROUP // 2)  # noqa: E731
    return (Int4Operands(pack(high), (w.scales * np.float32(16)).astype(np.float32), None),
            Int4Operands(pack(low), w.scales, np.zeros((rows, groups), np.uint8)))
