"""bfloat16 arithmetic in elementwise ONNX ops: each node computes in float32 and rounds its outputs to bfloat16.

bfloat16 is a storage type in the IR (ir/dtypes.py): no backend computes in it. ONNX's reference runs an op on
bfloat16 arrays with ml_dtypes' numpy arithmetic, which computes every numpy step in float32 and rounds its
result to bfloat16, so every intermediate of the op is rounded. Here the node's bfloat16 inputs are cast to
float32, the node imports as it would on float32, and its float32 outputs are cast back (round to nearest
even): one rounding per ONNX node.

Measured against ONNX's reference (`tests/onnx/test_onnx_bfloat16.py`; every one of the 65280 finite
bfloat16 values as input): the ops in ELEMENTWISE_VIA_FLOAT32 give the reference's bits wherever its output
is at least 2^-6 in magnitude (Exp: 1 input 1 ulp off). Below that Atanh, Celu, Elu and Softplus differ
where the reference cancels: its exp(x) - 1 of a tiny x rounds to 0 in bfloat16, float32 keeps x. ONNX's
Celu cases (`test_celu_bfloat16`, expanded too) match bit for bit. Left out, refused by name on bfloat16:
Sigmoid, Selu, LeakyRelu, HardSwish, Softsign, Swish and Mish differ by 1-2 ulps on 0.5-4.5% of the inputs
with outputs in the normal range, Gelu by up to 21, Sinh, Cosh, Asinh and Acosh by more (the reference
rounds each of its steps). Attention on bfloat16 does not match either: with each ONNX node of its
expanded form in float32 and rounded, or the whole op in float32 rounded once, 1-2 bfloat16 ulps differ on
12-41% of the outputs of each of ONNX's 10 cases, over their tolerance (rtol 1e-3 is under one bfloat16
ulp); the reference also rounds inside its sums, in the softmax and the matmuls, at every step. Ops that
reduce (Softmax, LogSoftmax, MatMul, Attention, the normalizations) therefore stay refused by name on
bfloat16, as float8 and float4 arithmetic is.
"""

from __future__ import annotations

import numpy as np

from edgerun.frontends.onnx.context import Handler, ImportContext, OnnxNode, Out
from edgerun.ir.dtypes import DType, narrow_cast

# Per element, and bit for bit the reference's wherever |output| >= 2^-6 on every finite bfloat16 input.
ELEMENTWISE_VIA_FLOAT32 = frozenset({
    "Relu", "PRelu", "ThresholdedRelu", "Elu", "Celu", "HardSigmoid", "Shrink", "Softplus", "Tanh", "Exp", "Log",
    "Sqrt", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Atanh", "Reciprocal",
})

BFLOAT16_REFUSAL = ("float32 arithmetic rounded once per node does not reproduce ONNX's reference, which rounds "
                    "every intermediate to bfloat16, sums included (measured: frontends/onnx/narrow_float.py); "
                    "cast to float32 around it")


def import_via_float32(ctx: ImportContext, node: OnnxNode, handler: Handler) -> list[Out] | None:
    """The node's outputs computed in float32 and rounded to bfloat16, for an elementwise op that reads
    bfloat16; None for any other node (the handler imports it as usual)."""
    bf16 = [i for i in dict.fromkeys(node.inputs) if i and ctx.known(i) and ctx.dtype(i) is DType.bfloat16]
    if not bf16 or node.op_type not in ELEMENTWISE_VIA_FLOAT32:
        return None
    saved = {name: (ctx.values.get(name), ctx.consts.get(name)) for name in bf16}
    try:
        for name in bf16:  # the handler sees float32 values under the node's input names
            ctx.values[name] = ctx.cast(ctx.value(name), DType.float32)
            ctx.consts.pop(name, None)
        outs = handler(ctx, node)
    finally:
        for name, (value, const) in saved.items():
            ctx.values.pop(name, None)
            if value is not None:
                ctx.values[name] = value
            if const is not None:
                ctx.consts[name] = const
    return [_rounded(ctx, out) for out in outs]


def _rounded(ctx: ImportContext, out: Out) -> Out:
    if isinstance(out, np.ndarray):
        return narrow_cast(out, DType.bfloat16) if out.dtype == np.float32 else out
    return ctx.cast(out, DType.bfloat16) if ctx.b.dtype(out) is DType.float32 else out
