"""Quantized ops: int8/uint8 values with their scale and zero point as explicit operands, int4 packed weights.

A quantized tensor is a plain int8/uint8 value; its scale (float32) and zero point (same dtype as the data)
are ordinary operands of the ops that produce and read it, as in ONNX. So TensorSpec needs no quantization
fields, a per-tensor and a per-channel scale are the same op (the scale broadcasts numpy-style against the
data: shape () per tensor, [C, 1, 1] per channel of NCHW, [rows, 1] per token), and passes see the
parameters as values they can fold or share. Accumulators are int32. Int4 weights are packed two per byte
(element 2i in the low nibble, ONNX Runtime's MatMulNBits layout) with one scale and zero point per group
of `group_size` elements along K.

The reference kernels (edgerun/oracle/quant_kernels.py) are exact: integer accumulation, and rounding
half to even with saturation as the ONNX spec says.
"""

from __future__ import annotations

from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.ops._rules import broadcast_shapes
from edgerun.ir.ops.atomic import _window_out as window_out
from edgerun.ir.ops.atomic import conv_geometry
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.tensor_spec import TensorSpec

Attrs = dict[str, Any]
QUANT_DTYPES = (DType.int8, DType.uint8)
INT4_GROUP_SIZES = (16, 32, 64, 128, 256)
# matmul_int4's `activations`: "float" (default) multiplies the float input by the dequantized weight;
# "int8" first rounds the input to int8 per row and group (llama.cpp's Q8 activations, ORT's accuracy_level 4).
INT4_ACTIVATIONS = ("float", "int8")


def _params_fit(op: str, x: TensorSpec, scale: TensorSpec, zp: TensorSpec, data_dtypes: tuple[DType, ...]) -> None:
    """Scale is float32 and zero point one of `data_dtypes`, each broadcasting onto x without growing it."""
    if scale.dtype is not DType.float32:
        raise ValueError(f"{op} scale must be float32, got {scale}")
    if zp.dtype not in data_dtypes:
        raise ValueError(f"{op} zero point must be {'/'.join(d.value for d in data_dtypes)}, got {zp}")
    for what, p in (("scale", scale), ("zero point", zp)):
        if broadcast_shapes(x.shape, p.shape) != x.shape:
            raise ValueError(f"{op} {what} {p} does not broadcast onto {x}")


def _quantize_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x, scale, zp = ins
    if x.dtype is not DType.float32:
        raise ValueError(f"quantize_linear needs a float32 input, got {x}")
    _params_fit("quantize_linear", x, scale, zp, QUANT_DTYPES)
    return [TensorSpec(x.shape, zp.dtype)]


register(OpDef("quantize_linear", OpKind.ATOMIC, _quantize_rule, 3, 3, family="quant", doc=(
    "y = saturate(round_half_even(x / scale) + zero_point) to the zero point's int8/uint8; scale and zero "
    "point broadcast (per tensor, per channel, per token); the entry to every int8 path")))


def _dequantize_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    q, scale, zp = ins
    if q.dtype not in (*QUANT_DTYPES, DType.int32):
        raise ValueError(f"dequantize_linear needs int8, uint8 or int32 data, got {q}")
    _params_fit("dequantize_linear", q, scale, zp, (q.dtype,))
    return [TensorSpec(q.shape, DType.float32)]


register(OpDef("dequantize_linear", OpKind.ATOMIC, _dequantize_rule, 3, 3, family="quant", doc=(
    "y = (q - zero_point) * scale in float32 (the subtraction exact in int32); the exit from int8 and the "
    "DQ of QDQ graphs")))


def _requantize_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    acc, scale, zp = ins
    if acc.dtype is not DType.int32:
        raise ValueError(f"requantize needs an int32 accumulator, got {acc}")
    _params_fit("requantize", acc, scale, zp, QUANT_DTYPES)
    if attrs.get("arithmetic", "exact") not in REQUANTIZE_ARITHMETIC:
        raise ValueError(f"requantize arithmetic must be one of {REQUANTIZE_ARITHMETIC}, got {attrs['arithmetic']!r}")
    return [TensorSpec(acc.shape, zp.dtype)]


# "exact": acc * scale as a rational number; "float32": float32(acc) * scale rounded to float32 first, the
# epilogue ONNX Runtime's QLinearConv/QLinearMatMul kernels compute (so a delegate can run it bit-exactly).
REQUANTIZE_ARITHMETIC = ("exact", "float32")

register(OpDef("requantize", OpKind.ATOMIC, _requantize_rule, 3, 3, family="quant", doc=(
    "int32 accumulator -> int8/uint8: saturate(round_half_even(acc * scale) + zero_point), computed exactly "
    "in fixed point (scale's 24-bit mantissa times acc in int64), or with attr arithmetic='float32' as "
    "float32(float32(acc) * scale) (ONNX Runtime's kernels); the epilogue of QLinearConv/QLinearMatMul")))


def _matmul_integer_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    a, b, a_zp, b_zp = ins
    for what, v, zp in (("a", a, a_zp), ("b", b, b_zp)):
        if v.dtype not in QUANT_DTYPES or zp.dtype is not v.dtype:
            raise ValueError(f"matmul_integer {what} and its zero point must be one of int8/uint8, got {v}, {zp}")
        if broadcast_shapes(v.shape, zp.shape) != v.shape:
            raise ValueError(f"matmul_integer {what} zero point {zp} does not broadcast onto {v}")
    if a.rank < 2 or b.rank < 2 or a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul_integer needs [.., M, K] @ [.., K, N], got {a} @ {b}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [TensorSpec((*batch, a.shape[-2], b.shape[-1]), DType.int32)]


register(OpDef("matmul_integer", OpKind.ATOMIC, _matmul_integer_rule, 4, 4, family="quant", doc=(
    "(a - a_zp) @ (b - b_zp) accumulated exactly in int32; zero points per tensor, per row of a or per "
    "column of b; dynamic-quantized linear layers and attention")))


def _conv_integer_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x, w, x_zp, w_zp = ins
    if x.dtype not in QUANT_DTYPES or w.dtype not in QUANT_DTYPES:
        raise ValueError(f"conv_integer needs int8/uint8 input and weight, got {x} and {w}")
    if x_zp.dtype is not x.dtype or w_zp.dtype is not w.dtype or x_zp.numel != 1:
        raise ValueError(f"conv_integer zero points must match their data and the input's be one value, "
                         f"got {x_zp} and {w_zp}")
    if x.rank != 4 or w.rank != 4:
        raise ValueError(f"conv_integer needs NCHW input and OIHW weight, got {x} and {w}")
    if w_zp.numel not in (1, w.shape[0]) or broadcast_shapes(w.shape, w_zp.shape) != w.shape:
        raise ValueError(f"conv_integer weight zero point must be one value or [{w.shape[0]}, 1, 1, 1], got {w_zp}")
    stride, pads, dil, groups = conv_geometry(attrs)
    if groups < 1 or x.shape[1] != w.shape[1] * groups or w.shape[0] % groups:
        raise ValueError(f"conv_integer channels do not fit groups={groups}: input {x}, weight {w}")
    if min(stride) < 1 or min(dil) < 1 or min(pads) < 0:
        raise ValueError("conv_integer stride and dilation must be >= 1 and padding >= 0")
    h = window_out(x.shape[2], w.shape[2], stride[0], pads[0], pads[2], dil[0], False)
    wd = window_out(x.shape[3], w.shape[3], stride[1], pads[1], pads[3], dil[1], False)
    return [TensorSpec((x.shape[0], w.shape[0], h, wd), DType.int32)]


register(OpDef("conv_integer", OpKind.ATOMIC, _conv_integer_rule, 4, 4, family="quant", doc=(
    "2-D convolution of (x - x_zp) and (w - w_zp) accumulated exactly in int32, padding with x_zp (a real "
    "zero); weight zero point per tensor or per output channel; int8 CNNs")))


def _dynamic_quantize_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    (x,) = ins
    if x.dtype is not DType.float32 or x.rank < 1:
        raise ValueError(f"dynamic_quantize needs a float32 tensor of rank >= 1, got {x}")
    dtype = DType(attrs.get("dtype", "uint8"))
    if dtype not in QUANT_DTYPES:
        raise ValueError(f"dynamic_quantize dtype must be int8 or uint8, got {dtype.value}")
    params = (*x.shape[:-1], 1) if attrs.get("per_token") else ()
    return [TensorSpec(x.shape, dtype), TensorSpec(params, DType.float32), TensorSpec(params, dtype)]


register(OpDef("dynamic_quantize", OpKind.ATOMIC, _dynamic_quantize_rule, 1, 1, family="quant", doc=(
    "(q, scale, zero_point) from the tensor's own range including 0, per tensor or per token (last axis; "
    "attr per_token), to uint8 or int8 (attr dtype); ONNX DynamicQuantizeLinear and 8-bit dynamic activations")))


def _matmul_int4_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    from edgerun.ir.builder import absent
    a, packed, scales = ins[:3]
    zp = ins[3] if len(ins) > 3 and not absent(ins[3]) else None
    k, n, group = int(attrs["k"]), int(attrs["n"]), int(attrs["group_size"])
    if group not in INT4_GROUP_SIZES:
        raise ValueError(f"matmul_int4 group_size must be one of {INT4_GROUP_SIZES}, got {group}")
    blocks = -(-k // group)
    if a.dtype is not DType.float32 or a.rank < 2 or a.shape[-1] != k:
        raise ValueError(f"matmul_int4 needs a float32 [.., M, {k}] input, got {a}")
    if packed != TensorSpec((n, blocks, group // 2), DType.uint8):
        raise ValueError(f"matmul_int4 packed weight must be uint8[{n},{blocks},{group // 2}], got {packed}")
    if scales != TensorSpec((n, blocks), DType.float32):
        raise ValueError(f"matmul_int4 scales must be float32[{n},{blocks}], got {scales}")
    if zp is not None and (zp.shape != (n, blocks) or zp.dtype not in (DType.uint8, DType.float32)):
        raise ValueError(f"matmul_int4 zero points must be uint8 or float32 [{n},{blocks}], got {zp}")
    activations = attrs.get("activations", "float")
    if activations not in INT4_ACTIVATIONS:
        raise ValueError(f"matmul_int4 activations must be one of {INT4_ACTIVATIONS}, got {activations!r}")
    if activations == "int8" and zp is not None and zp.dtype is not DType.uint8:
        raise ValueError("matmul_int4 with int8 activations needs integer (uint8) zero points")
    return [TensorSpec((*a.shape[:-1], n), DType.float32)]


register(OpDef("matmul_int4", OpKind.ATOMIC, _matmul_int4_rule, 3, 4, family="quant", doc=(
    "a @ dequant(w).T with w int4 packed two per byte [N, K/group, group/2], one scale and zero point (uint8 "
    "0..15, default 8, or float32: the minimum form) per group of 16..256 along K, dequantized group by group; "
    "weight-only int4 linear layers (LLMs, MatMulNBits); attr activations='int8' rounds the input to int8 per "
    "row and group first (LLM decoding, llama.cpp's Q8 activations)")))
