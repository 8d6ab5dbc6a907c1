"""The element types a tensor may have, and their numpy equivalents.

Every numpy-native numeric type is here, and the narrow types numpy lacks (bfloat16, float8 with e8m0, float4,
int4/uint4, int2/uint2) as ml_dtypes' numpy dtypes. ml_dtypes is imported only when one of those is used, so a
program without them runs on numpy alone. The narrow types are storage types: Cast converts to and from them (through
float32, rounding to nearest even, `narrow_cast`), and ONNX's QuantizeLinear/DequantizeLinear on them lower to
float32 arithmetic and a Cast. Ops whose shape rules take any type (data movement, gather, compress, matmul)
run on them on the reference in ml_dtypes' own arithmetic, as ONNX's reference does; ops that need a float
input (exp, softmax, ...) refuse them (is_float is False for them), and no backend but the reference declares
kernels for them. An int4 or int2 element takes one byte, in memory (as ml_dtypes holds it) and in the program
file: ONNX packs two int4 per byte, but a byte each keeps every segment a plain numpy view (np.frombuffer),
and these types are rare enough that the halved size is not worth an unpacking step on load. Complex types are
not here: no op or backend computes on complex values.

`string` holds text: a numpy object array whose every element is a Python `str` (`string_array` checks it).
numpy 2's StringDType was the other choice; object arrays are what ONNX's reference implementation, ONNX
Runtime and `onnx.numpy_helper` produce and expect, so a string tensor crosses those boundaries (and the
conformance runner's dtype check) without conversion, and the oracle kernels (oracle/string_kernels.py)
work per element in Python anyway. A string element is a reference, not bytes: string tensors never live in
the runtime's byte arena or a device buffer, only the reference runs nodes that touch them
(Backend.holds_strings), and the program file stores string constants length-prefixed
(program/string_segment.py)."""

from __future__ import annotations

import builtins
from enum import StrEnum
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError


class DType(StrEnum):
    float32 = "float32"
    float16 = "float16"
    float64 = "float64"
    int8 = "int8"
    uint8 = "uint8"
    int16 = "int16"
    uint16 = "uint16"
    int32 = "int32"
    uint32 = "uint32"
    int64 = "int64"
    uint64 = "uint64"
    bool = "bool"
    # Narrow types, ml_dtypes' names (np.dtype(ml_dtypes.x).name), so DType.of finds them.
    bfloat16 = "bfloat16"
    float8_e4m3fn = "float8_e4m3fn"
    float8_e4m3fnuz = "float8_e4m3fnuz"
    float8_e5m2 = "float8_e5m2"
    float8_e5m2fnuz = "float8_e5m2fnuz"
    float8_e8m0fnu = "float8_e8m0fnu"  # a power of two (exponent only): MX formats' block scales
    float4_e2m1fn = "float4_e2m1fn"
    int4 = "int4"
    uint4 = "uint4"
    int2 = "int2"
    uint2 = "uint2"
    string = "string"  # an object array of Python str (string_array)

    @property
    def np(self) -> np.dtype:
        if self is DType.string:
            return np.dtype(object)
        if self.is_narrow:
            return np.dtype(getattr(_ml_dtypes(), self.value))
        return np.dtype(self.value)

    @property
    def is_narrow(self) -> builtins.bool:
        """A type numpy lacks, held as an ml_dtypes dtype: storage only (Cast, Quantize/DequantizeLinear)."""
        return self.value in NARROW_NAMES

    @property
    def is_float8(self) -> builtins.bool:
        """The four float8 kinds with a mantissa, those Cast's `saturate` clamps (not e8m0: its own rounding)."""
        return self.value.startswith("float8_") and self is not DType.float8_e8m0fnu

    @property
    def itemsize(self) -> int:
        return int(self.np.itemsize)

    @property
    def is_float(self) -> builtins.bool:
        return self in (DType.float32, DType.float16, DType.float64)

    @property
    def is_int(self) -> builtins.bool:
        return self.is_signed_int or self.is_unsigned_int

    @property
    def is_signed_int(self) -> builtins.bool:
        return self in (DType.int8, DType.int16, DType.int32, DType.int64)

    @property
    def is_unsigned_int(self) -> builtins.bool:
        return self in (DType.uint8, DType.uint16, DType.uint32, DType.uint64)

    @staticmethod
    def of(x: object) -> DType:
        """The DType of a numpy dtype, array, or dtype name; raises ValueError for anything else."""
        if isinstance(x, str) and x in DType.__members__:
            return DType(x)  # by name: no np.dtype lookup, which knows the narrow names only once ml_dtypes is in
        name = np.dtype(x.dtype if hasattr(x, "dtype") else x).name  # type: ignore[arg-type, attr-defined]
        if name == "object":
            return DType.string  # object arrays hold strings (string_array checks the elements)
        try:
            return DType(name)
        except ValueError:
            raise ValueError(f"dtype {name!r} is not one of {[d.value for d in DType]}") from None


NARROW_NAMES = frozenset({"bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
                          "float8_e8m0fnu", "float4_e2m1fn", "int4", "uint4", "int2", "uint2"})
E8M0_ROUND_MODES = ("up", "down", "nearest")


def _ml_dtypes() -> Any:
    """ml_dtypes, imported only where a narrow type is used; a clear error where it is not installed."""
    try:
        import ml_dtypes
    except ImportError:
        raise EdgerunError("bfloat16, float8, float4, int4 and int2 tensors need the ml_dtypes package: "
                           "pip install 'edgerun[narrow]'") from None
    return ml_dtypes


def narrow_cast(x: np.ndarray, to: DType, saturate: builtins.bool = True, round_mode: str = "up") -> np.ndarray:
    """Convert to or from a narrow type as ONNX's Cast specifies (its reference implementation agrees).

    Values pass through float32 (exact for every narrow float and for float16) and round to nearest even.
    To float8e8m0 see `_to_e8m0` (`round_mode`). To float8 with `saturate`, values beyond the largest finite value, infinities included, clamp to it;
    without, they become inf (e5m2) or NaN (types without inf), as ml_dtypes converts. To int4/uint4/int2/uint2
    a float truncates toward zero and wraps, as ONNX's reference (and its test data) does.
    """
    ml_dtypes = _ml_dtypes()
    target = to.np
    if to is DType.float8_e8m0fnu:
        return _to_e8m0(np.asarray(x), saturate, round_mode).view(target)
    if to.is_float8 and saturate:
        info = ml_dtypes.finfo(target)
        with np.errstate(invalid="ignore"):
            x = np.clip(x.astype(np.float32), float(info.min), float(info.max))
    with np.errstate(all="ignore"):
        return np.asarray(x).astype(target)


def _to_e8m0(x: np.ndarray, saturate: builtins.bool, round_mode: str) -> np.ndarray:
    """float8e8m0's bits as ONNX's Cast (opset 24) defines them: float32's biased exponent, the sign dropped;
    NaN and inf -> 0xFF (NaN); `round_mode` up adds one where any mantissa bit is set, down truncates, nearest
    rounds on the guard bit (up when the round or sticky bit is set or the exponent is non-zero, as the spec's
    reference does); `saturate` keeps a round up from 0xFE (2^127) to NaN."""
    if round_mode not in E8M0_ROUND_MODES:
        raise ValueError(f"float8e8m0 round_mode {round_mode!r} is not one of {E8M0_ROUND_MODES}")
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    exponent = ((bits >> 23) & 0xFF).astype(np.uint16)
    special = exponent == 0xFF
    if round_mode == "up":
        up = (bits & 0x7FFFFF) > 0
    elif round_mode == "nearest":
        guard, rest = (bits & 0x400000) > 0, (bits & 0x3FFFFF) > 0
        up = guard & (rest | (exponent > 0))
    else:
        up = np.zeros(bits.shape, bool)
    up &= ~special
    if saturate:
        up &= exponent != 0xFE
    return np.where(special, 0xFF, exponent + up).astype(np.uint8)


def string_array(x: object, what: str) -> np.ndarray:
    """`x` as a string tensor: an object array of Python str (a numpy unicode array is converted). Anything
    else, numbers or an object array holding a non-str, is an EdgerunError naming `what`."""
    arr = np.asarray(x)
    if arr.dtype.kind == "U":
        return arr.astype(object)
    if arr.dtype != object:
        raise EdgerunError(f"{what} must be a string tensor (an object array of str), got {arr.dtype}")
    for element in arr.reshape(-1):
        if type(element) is not str:
            raise EdgerunError(f"{what} must hold only str elements, got {type(element).__name__} {element!r:.40}")
    return arr


def promote(a: DType, b: DType) -> DType:
    """Result type of a binary op on two tensors (numpy's rule restricted to our dtypes)."""
    return DType.of(np.promote_types(a.np, b.np))
