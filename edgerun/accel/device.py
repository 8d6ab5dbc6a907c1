"""The emulated `npu`: an Edge-TPU-class device that only runs the seed's 8-bit operators.

Exact emulation of what such a device computes: int8 inputs and weights, int32 accumulation, outputs
requantized to int8 (`q = clamp(round(acc * multiplier) + zero_point, -128, 127)`), and a device memory of
limited size that operands are copied into and results out of. Kernels are integer arithmetic on the CPU.
Integer dot products go through BLAS in float32/float64 only when the operands' bound proves every partial
sum is an integer below 2^24 (float32) or 2^53 (float64): such sums are exact in any order, so the result
is bit-identical to an int32 accumulator (the tests check this against int64 matmul). Time is not measured
here but modelled (`costmodel`): what the same instructions would cost on the device.
"""

from __future__ import annotations

import collections
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.accel.costmodel import OPERATORS, instruction_seconds, transfer_seconds
from edgerun.errors import EdgerunError

DEVICE_MEMORY_BYTES = 8 << 20  # the Edge TPU's on-chip data memory
INT32_LIMIT = 2**31


@dataclass
class Instruction:
    """One device instruction: an operator on resident int8 operands with its requantization."""

    op: str
    operands: tuple[tuple[Hashable, np.ndarray], ...]  # (residency key, int8 array)
    params: dict[str, Any] = field(default_factory=dict)
    multiplier: float = 1.0  # output requantization
    zero_point: int = 0
    exact: bool = False  # the Tensorizer promised the output fits: saturation is an error, not a rounding
    affinity: Hashable | None = None  # instructions sharing it go to one device (their model stays resident)


def exact_int_matmul(a: np.ndarray, b: np.ndarray, bound: int) -> np.ndarray:
    """a @ b for integer-valued arrays whose every partial sum is bounded by `bound`.

    The result holds exact integers (in a float dtype when that is exact, else int64)."""
    if bound < 2**24:
        return a.astype(np.float32) @ b.astype(np.float32)
    if bound < 2**53:
        return a.astype(np.float64) @ b.astype(np.float64)
    return a.astype(np.int64) @ b.astype(np.int64)


def _absmax(x: np.ndarray) -> int:
    return int(np.abs(x.astype(np.int32)).max()) if x.size else 0


def _conv2d(x: np.ndarray, w: np.ndarray, stride: tuple[int, int]) -> np.ndarray:
    """NHWC input, HWCK filter, VALID padding (the Tensorizer pads with `ext` first)."""
    if x.ndim != 4 or w.ndim != 4 or x.shape[3] != w.shape[2]:
        raise EdgerunError(f"conv2D wants NHWC input and HWCK filter with equal C, got {x.shape} and {w.shape}")
    fh, fw, c, k = w.shape
    sh, sw = stride
    if x.shape[1] < fh or x.shape[2] < fw:
        raise EdgerunError(f"conv2D filter {fh}x{fw} is larger than its input {x.shape[1]}x{x.shape[2]}")
    if (sh, sw) == (fh, fw) and x.shape[1] % fh == 0 and x.shape[2] % fw == 0:
        # stride == filter: non-overlapping patches, a reshape (the GEMM layout)
        n, h, wd = x.shape[0], x.shape[1] // fh, x.shape[2] // fw
        patches = x.reshape(n, h, fh, wd, fw, c).transpose(0, 1, 3, 2, 4, 5)
    else:
        win = np.lib.stride_tricks.sliding_window_view(x, (fh, fw), axis=(1, 2))[:, ::sh, ::sw]
        patches = win.transpose(0, 1, 2, 4, 5, 3)  # N, Ho, Wo, fh, fw, C
    n, ho, wo = patches.shape[:3]
    cols = np.ascontiguousarray(patches).reshape(n * ho * wo, fh * fw * c)
    bound = fh * fw * c * _absmax(x) * _absmax(w)
    _check_accumulator(bound)
    return exact_int_matmul(cols, w.reshape(fh * fw * c, k), bound).reshape(n, ho, wo, k)


def _check_accumulator(bound: int) -> None:
    if bound >= INT32_LIMIT:
        raise EdgerunError(f"an instruction's accumulator could reach {bound}, past the device's int32 accumulator")


def _fully_connected(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    if x.ndim != 2 or w.ndim != 2 or x.shape[1] != w.shape[0]:
        raise EdgerunError(f"FullyConnected wants (batch, K) input and (K, N) weights, got {x.shape} and {w.shape}")
    bound = x.shape[1] * _absmax(x) * _absmax(w)
    _check_accumulator(bound)
    return exact_int_matmul(x, w, bound)


def _pairwise(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.shape != b.shape:
        raise EdgerunError(f"{op} wants operands of one shape, got {a.shape} and {b.shape}")
    a32, b32 = a.astype(np.int32), b.astype(np.int32)
    return {"add": np.add, "sub": np.subtract, "mul": np.multiply}[op](a32, b32)


def _tanh_table(input_scale: float) -> np.ndarray:
    # int8 tanh is a 256-entry lookup table (as in TFLite's int8 kernel): output grid is 1/127
    codes = np.arange(-128, 128, dtype=np.float64)
    return np.clip(np.rint(127.0 * np.tanh(codes * input_scale)), -128, 127).astype(np.int32)


def compute_accumulator(ins: Instruction) -> tuple[np.ndarray, bool]:
    """The int32 accumulator (or pass-through values) of one instruction; bool: already final int8."""
    arrays = [a for _, a in ins.operands]
    for a in arrays:
        if a.dtype != np.int8:
            raise EdgerunError(f"{ins.op}: device operands are int8, got {a.dtype}")
    op, p = ins.op, ins.params
    if op == "conv2D":
        return _conv2d(arrays[0], arrays[1], tuple(p.get("stride", (1, 1)))), False
    if op == "FullyConnected":
        return _fully_connected(arrays[0], arrays[1]), False
    if op in ("add", "sub", "mul"):
        return _pairwise(op, arrays[0], arrays[1]), False
    if op == "crop":
        r0, c0, h, w = p["box"]
        return arrays[0][..., r0:r0 + h, c0:c0 + w], True
    if op == "ext":
        h, w = p["shape"]
        x = arrays[0]
        out = np.zeros((*x.shape[:-2], h, w), dtype=np.int8)
        out[..., : x.shape[-2], : x.shape[-1]] = x
        return out, True
    if op == "mean":
        x = arrays[0].astype(np.int32)
        n = x.shape[-1] * x.shape[-2]
        return np.rint(x.sum(axis=(-2, -1)) / n).astype(np.int32), False
    if op == "max":
        return arrays[0].max(axis=(-2, -1)), True
    if op == "tanh":
        return _tanh_table(float(p["input_scale"]))[arrays[0].astype(np.int32) + 128].astype(np.int8), True
    if op == "ReLU":
        return np.maximum(arrays[0], 0), True
    raise EdgerunError(f"unknown npu operator {op!r}; the device runs {', '.join(sorted(OPERATORS))}")


def requantize(acc: np.ndarray, multiplier: float, zero_point: int) -> tuple[np.ndarray, int]:
    """int8 output of an int32 accumulator, and how many values saturated."""
    if multiplier == 1.0:
        scaled = acc + acc.dtype.type(zero_point)
        if scaled.size == 0 or (scaled.min() >= -128 and scaled.max() <= 127):
            return scaled.astype(np.int8), 0
    else:
        scaled = np.rint(acc.astype(np.float64) * multiplier) + zero_point
    clipped = np.clip(scaled, -128, 127)
    return clipped.astype(np.int8), int(np.count_nonzero(clipped != scaled))


class NpuDevice:
    """One emulated device: its memory (LRU over residency keys), its instruction count and modelled time."""

    def __init__(self, index: int = 0, memory_bytes: int = DEVICE_MEMORY_BYTES) -> None:
        self.index = index
        self.memory_bytes = memory_bytes
        self._resident: collections.OrderedDict[Hashable, int] = collections.OrderedDict()
        self.used_bytes = 0
        self.instructions = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.compute_s = 0.0
        self.transfer_s = 0.0

    @property
    def model_s(self) -> float:
        return self.compute_s + self.transfer_s

    def copy_in(self, key: Hashable, array: np.ndarray, pinned: frozenset[Hashable] = frozenset()) -> None:
        """Make `array` resident under `key` (a no-op when it already is), evicting unpinned data if needed."""
        if key in self._resident:
            self._resident.move_to_end(key)
            return
        self._reserve(array.nbytes, pinned)
        self._resident[key] = array.nbytes
        self.used_bytes += array.nbytes
        self.bytes_in += array.nbytes
        self.transfer_s += transfer_seconds(array.nbytes)

    def free(self, key: Hashable) -> None:
        """Drop resident data."""
        if key in self._resident:
            self.used_bytes -= self._resident.pop(key)

    def resident(self, key: Hashable) -> bool:
        return key in self._resident

    def _reserve(self, nbytes: int, pinned: frozenset[Hashable]) -> None:
        if nbytes > self.memory_bytes:
            raise EdgerunError(f"npu{self.index}: {nbytes} bytes cannot be held in {self.memory_bytes} bytes of "
                               "device memory")
        if self.used_bytes + nbytes <= self.memory_bytes:
            return
        for key in list(self._resident):
            if self.used_bytes + nbytes <= self.memory_bytes:
                break
            if key not in pinned:
                self.used_bytes -= self._resident.pop(key)
        if self.used_bytes + nbytes > self.memory_bytes:
            raise EdgerunError(f"npu{self.index}: one instruction's operands and output need more than the "
                               f"{self.memory_bytes} bytes of device memory")

    def execute(self, ins: Instruction) -> np.ndarray:
        """Copy operands in (unless resident), run the instruction, copy its int8 output out."""
        if ins.op not in OPERATORS:
            raise EdgerunError(f"unknown npu operator {ins.op!r}; the device runs {', '.join(sorted(OPERATORS))}")
        pinned = frozenset(k for k, _ in ins.operands)
        for key, array in ins.operands:
            self.copy_in(key, array, pinned)
        acc, final = compute_accumulator(ins)
        out_bytes = int(np.prod(acc.shape))
        self._reserve(out_bytes, pinned)  # the output buffer must fit beside the operands
        if final:
            out = np.asarray(acc, dtype=np.int8)
        else:
            out, saturated = requantize(acc, ins.multiplier, ins.zero_point)
            if saturated and ins.exact:
                raise EdgerunError(f"{ins.op}: {saturated} outputs saturated the int8 grid in an exact instruction "
                                   "(the Tensorizer's bound was wrong)")
        self.instructions += 1
        self.compute_s += instruction_seconds(ins.op, max(1, out.size))
        return self.copy_out(out)

    def copy_out(self, out: np.ndarray) -> np.ndarray:
        """Move a result to the host (its transfer is what costs)."""
        self.bytes_out += out.nbytes
        self.transfer_s += transfer_seconds(out.nbytes)
        return out
