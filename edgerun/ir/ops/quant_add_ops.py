"""`quantized_add`: two uint8/int8 tensors, each with its own per-tensor scale and zero point, added and
requantized to a third scale and zero point without leaving 8 bits (ONNX Runtime's com.microsoft QLinearAdd).

Its arithmetic is ONNX Runtime's x86 kernel (MLAS `MlasQLinearAddKernelAvx2Helper`), spelled out so the
reference computes it bit for bit and the delegate may run it as QLinearAdd (edgerun/oracle/quant_add_kernel.py):

    ra = f32(a_scale / y_scale); rb = f32(b_scale / y_scale)
    fixed = f32(y_zp - f32(f32(ra * a_zp) + f32(rb * b_zp)))
    y = saturate(round_half_even(fma(a, ra, fma(b, rb, fixed))))      (each fma rounded once, to float32)

It is not dequantize -> add -> quantize: the zero points are folded into `fixed` in float32 and the sum is
rounded once, so a value can land one step away from the float add's quantized result. The int8-static flow
places it on residual adds (edgerun/quantization/rewrite.py), where ONNX Runtime's own quantizer puts QLinearAdd.
"""

from __future__ import annotations

from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.ops.quant_ops import QUANT_DTYPES
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.tensor_spec import TensorSpec


def _quantized_add_rule(ins: list[TensorSpec], attrs: dict[str, Any]) -> list[TensorSpec]:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = ins
    if a.dtype not in QUANT_DTYPES or b.dtype is not a.dtype or a.shape != b.shape:
        raise ValueError(f"quantized_add needs two int8 or two uint8 tensors of one shape, got {a} and {b}")
    for what, scale, zp in (("a", a_scale, a_zp), ("b", b_scale, b_zp), ("y", y_scale, y_zp)):
        if scale.dtype is not DType.float32 or scale.numel != 1:
            raise ValueError(f"quantized_add {what} scale must be one float32 value, got {scale}")
        if zp.dtype is not a.dtype or zp.numel != 1:
            raise ValueError(f"quantized_add {what} zero point must be one {a.dtype.value} value, got {zp}")
    return [TensorSpec(a.shape, a.dtype)]


register(OpDef("quantized_add", OpKind.ATOMIC, _quantized_add_rule, 8, 8, family="quant", doc=(
    "(a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp) -> int8/uint8: a + b requantized to y's scale and "
    "zero point in ONNX Runtime's x86 QLinearAdd arithmetic (float32 scale ratios, zero points folded in "
    "float32, two fused multiply-adds, one rounding half to even); int8 residual adds")))
