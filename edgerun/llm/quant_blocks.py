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

The 5- and 6-bit formats are kept as integer codes, one a byte, never as float32:
- Q5_0, Q5_1 and Q5_K are read into the "q5_1" form, codes 0..31 with a scale and minimum per 32: Q5_0's
  d*(q - 16) is scale d, minimum -16*d; Q5_1's d*q + m as it is; Q5_K's super-blocks like Q4_K's (a 6-bit
  scale and minimum per 32 under `d` and `dmin`) with a fifth bit per code. All exact in float32 as above.
- Q6_K is read into the "q6_k" form: int8 codes q - 32 (-32..31) with one scale per 16 values, d times the
  sub-block's int8 scale (11 + 8 significant bits, exact), so d*sc*(q - 32) is scale * code with one
  exact product.
Both run as two int4 matmuls over the codes' high and low nibbles (`wide_as_two_int4`), as Q8_0 does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgerun.errors import EdgerunError

GROUP = 32  # values per block (per scale) in every format we read but Q6_K
Q6_K_GROUP = 16  # values per Q6_K scale

# scheme -> bytes per 32-value block
BLOCK_BYTES = {"q4_0": 18, "q4_1": 20, "q8_0": 34, "q5_0": 22, "q5_1": 24}
SUPER_BLOCK = 256  # values per K-quant super-block
ROWS_AT_ONCE = 4096  # rows converted at a time (bounds the temporaries of a large matrix's conversion)
Q4_K_BYTES = 144  # float16 d and dmin, 12 bytes of 6-bit scales and minimums, 128 bytes of codes
Q5_K_BYTES = 176  # Q4_K's, then 32 bytes of fifth bits
Q6_K_BYTES = 210  # 128 bytes of low nibbles, 64 of high two bits, 16 int8 scales, float16 d


@dataclass(frozen=True)
class PackedWeight:
    """A row-major [rows, cols] matrix quantized in groups of 32 along each row (rows = output features)."""

    scheme: str  # "q4_0" | "q4_1" | "q8_0" | "q5_1" | "q6_k": the packed form (Q4_K is read into "q4_1";
    # Q5_0, Q5_1, Q5_K into "q5_1")
    shape: tuple[int, int]
    data: np.ndarray  # q4: uint8 [rows, cols//2], byte k = element 2k (low nibble) | element 2k+1 (high);
    # q8_0, q6_k: int8 [rows, cols]; q5_1: uint8 [rows, cols], 0..31
    scales: np.ndarray  # float32 [rows, cols//group]
    mins: np.ndarray | None  # float32 [rows, cols//group]; None for q8_0 and q6_k

    @property
    def bits(self) -> int:
        return {"q8_0": 8, "q6_k": 6, "q5_1": 5}.get(self.scheme, 4)

    @property
    def group(self) -> int:
        """Values per scale along a row."""
        return Q6_K_GROUP if self.scheme == "q6_k" else GROUP

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes + self.scales.nbytes + (self.mins.nbytes if self.mins is not None else 0))

    def codes(self) -> np.ndarray:
        """The integer codes, one per element: uint8 0..15 for 4-bit schemes, 0..31 for q5_1, int8 for q8_0
        and q6_k."""
        if self.bits > 4:
            return self.data
        rows, cols = self.shape
        out = np.empty((rows, cols), np.uint8)
        out[:, 0::2] = self.data & 0x0F
        out[:, 1::2] = self.data >> 4
        return out

    def dequantize(self) -> np.ndarray:
        rows, cols = self.shape
        codes = self.codes().reshape(rows, cols // self.group, self.group).astype(np.float32)
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
    blocks = _super_blocks("Q4_K", raw, shape, Q4_K_BYTES)
    supers = blocks.shape[1]
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


def _super_blocks(name: str, raw: np.ndarray, shape: tuple[int, int], nbytes: int) -> np.ndarray:
    """`raw` as [rows, super-blocks, nbytes] after checking its size."""
    rows, cols = shape
    if cols % SUPER_BLOCK:
        raise EdgerunError(f"{name} row length {cols} is not a multiple of {SUPER_BLOCK}")
    supers = cols // SUPER_BLOCK
    if raw.dtype != np.uint8 or raw.size != rows * supers * nbytes:
        raise EdgerunError(f"{name} tensor of shape {shape} needs {rows * supers * nbytes} bytes, got {raw.size}")
    return np.ascontiguousarray(raw).reshape(rows, supers, nbytes)


def unpack_q5(scheme: str, raw: np.ndarray, shape: tuple[int, int]) -> PackedWeight:
    """Q5_0 or Q5_1 blocks (float16 d[, m], 32 fifth bits, 16 bytes of low nibbles) in the q5_1 form."""
    rows, cols = shape
    name = scheme.upper()
    if cols % GROUP:
        raise EdgerunError(f"{name} row length {cols} is not a multiple of {GROUP}")
    groups, per_block = cols // GROUP, BLOCK_BYTES[scheme]
    if raw.dtype != np.uint8 or raw.size != rows * groups * per_block:
        raise EdgerunError(f"{name} tensor of shape {shape} needs {rows * groups * per_block} bytes, got {raw.size}")
    blocks = np.ascontiguousarray(raw).reshape(rows, groups, per_block)
    scales = blocks[:, :, 0:2].copy().view(np.float16)[:, :, 0].astype(np.float32)
    if scheme == "q5_1":
        mins = blocks[:, :, 2:4].copy().view(np.float16)[:, :, 0].astype(np.float32)
    else:
        mins = (np.float32(-16) * scales).astype(np.float32)
    at = 4 if scheme == "q5_1" else 2
    high = blocks[:, :, at:at + 4].copy().view(np.uint32)  # bit j: element j's fifth bit
    fifth = ((high >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [rows, groups, 32]
    qs = blocks[:, :, at + 4:]  # low nibbles hold elements 0..15, high nibbles 16..31
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=2)
    codes = (low | (fifth << 4)).reshape(rows, cols)
    return PackedWeight("q5_1", shape, codes, scales, mins)


def unpack_q5_k(raw: np.ndarray, shape: tuple[int, int]) -> PackedWeight:
    """Q5_K super-blocks in the q5_1 form: Q4_K's scales and minimums, the fifth bits from 32 bytes where
    bit j of byte i is the fifth bit of element 32 j + i."""
    rows, cols = shape
    blocks = _super_blocks("Q5_K", raw, shape, Q5_K_BYTES)
    as_q4 = unpack_q4_k(np.concatenate([blocks[:, :, :16], blocks[:, :, 48:]], axis=2), shape)
    low = np.empty((rows, cols), np.uint8)
    low[:, 0::2], low[:, 1::2] = as_q4.data & 0x0F, as_q4.data >> 4
    qh = blocks[:, :, 16:48].reshape(rows, -1, 1, 32)  # [rows, supers, 1, 32]
    fifth = ((qh >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)) & 1).reshape(rows, cols)
    return PackedWeight("q5_1", shape, (low | (fifth << 4)).astype(np.uint8), as_q4.scales, as_q4.mins)


def unpack_q6_k(raw: np.ndarray, shape: tuple[int, int]) -> PackedWeight:
    """Q6_K super-blocks in the q6_k form: int8 codes q - 32, scale d * sc per 16 values."""
    rows, cols = shape
    blocks = _super_blocks("Q6_K", raw, shape, Q6_K_BYTES)
    supers = cols // SUPER_BLOCK
    # Each half of 128 values: 64 bytes of low nibbles (elements 0..63 low, 64..127 high) and 32 bytes of high
    # two bits (element i's at bits 2 * (i // 32) of byte i % 32).
    ql = blocks[:, :, :128].reshape(rows, supers, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    qh = blocks[:, :, 128:192].reshape(rows, supers, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    q = ((ql & 0x0F).reshape(rows, cols) | ((qh & 0x03).reshape(rows, cols) << 4)).astype(np.int8) - np.int8(32)
    d = blocks[:, :, 208:210].copy().view(np.float16).astype(np.float32)  # [rows, supers, 1]
    sc = blocks[:, :, 192:208].copy().view(np.int8).astype(np.float32)  # [rows, supers, 16]
    scales = (d * sc).reshape(rows, cols // Q6_K_GROUP).astype(np.float32)
    return PackedWeight("q6_k", shape, q.astype(np.int8), scales, None)


@dataclass
class Int4Operands:
    """matmul_int4's weight operands, plus what the int4 form cannot hold.

    w = input_scale * ((code - zero) * scale + offset), per group of 32 along K; x @ w.T is
    matmul_int4(input_scale * x, packed, scales, zeros) plus (input_scale * x summed per group) @ offsets.T, a
    [K/32]-wide float matmul, when there are offsets.
    """

    packed: np.ndarray  # uint8 [N, K/32, 16]
    scales: np.ndarray  # float32 [N, K/32]
    zeros: np.ndarray | None  # uint8 [N, K/32]; None means 8
    offsets: np.ndarray | None = None  # float32 [N, K/32]
    input_scale: float = 1.0  # a power of two: scaling the input is exact, int8 roundings included


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


def wide_as_two_int4(w: PackedWeight) -> tuple[Int4Operands, Int4Operands]:
    """A weight of 5- to 8-bit codes as the sum of two int4 matmuls over their high and low nibbles.

    q8_0, q6_k (int8 codes): code + 128 = 16 * high + low with high, low in 0..15, so scale * code =
    (16 * scale) * (high - 8) + scale * (low - 0). q5_1 (codes 0..31): scale * code + min = (16 * scale) *
    (high - 0) + scale * (low - 0) + min, the minimum as the low half's offset (Q5_0's min = -16 * scale as the
    high half's zero point 1 instead: no offset term). Exact in the integers, one extra float32 rounding in
    the sum. The groups are the weight's (16 for q6_k). The high half holds the weight's own scales (the
    same array as the low half's) with `input_scale` 16, not a second array of 16 * scale: Gemma 3's tied
    head would hold 21 MB more at the session's build.
    """
    if w.bits == 4:
        raise EdgerunError(f"{w.scheme} is a 4-bit scheme")
    rows, cols = w.shape
    groups, group = cols // w.group, w.group
    codes = w.codes()
    high, low = (np.empty((rows, groups, group // 2), np.uint8) for _ in range(2))
    # In slices of rows: whole-matrix temporaries of a 262,144-row embedding were 700 MB at the load's peak.
    for lo in range(0, rows, ROWS_AT_ONCE):
        part = codes[lo:lo + ROWS_AT_ONCE]
        biased = part.view(np.uint8) ^ np.uint8(0x80) if part.dtype == np.int8 else part  # code + 128
        high[lo:lo + ROWS_AT_ONCE] = two_per_byte(biased >> 4).reshape(-1, groups, group // 2)
        low[lo:lo + ROWS_AT_ONCE] = two_per_byte(biased & 0x0F).reshape(-1, groups, group // 2)
    zeros = np.zeros((rows, groups), np.uint8)
    if w.mins is None:
        return Int4Operands(high, w.scales, None, input_scale=16.0), Int4Operands(low, w.scales, zeros)
    if np.array_equal(w.mins, np.float32(-16) * w.scales):  # Q5_0: scale * (code - 16), the high nibble's zero 1
        return Int4Operands(high, w.scales, zeros + 1, input_scale=16.0), Int4Operands(low, w.scales, zeros)
    return Int4Operands(high, w.scales, zeros, input_scale=16.0), Int4Operands(low, w.scales, zeros, w.mins)
