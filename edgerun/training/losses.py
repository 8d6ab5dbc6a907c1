"""The built-in losses, emitted as IR on a model's output: the batch mean, as torch's default reduction."""

from __future__ import annotations

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.tensor_spec import TensorSpec

LOSSES = ("cross_entropy", "mse")


def target_spec(loss: str, output: TensorSpec) -> TensorSpec:
    """What the targets of `loss` on `output` must be."""
    if loss == "cross_entropy":
        if output.rank != 2 or not output.dtype.is_float:
            raise EdgerunError(f"cross_entropy needs float [batch, classes] scores as the first output, got {output}")
        return TensorSpec((output.shape[0],), DType.int64)
    if not output.dtype.is_float:
        raise EdgerunError(f"mse needs a float first output, got {output}")
    return output


def emit_loss(b: Builder, loss: str, output: str, targets: str) -> str:
    """The scalar mean loss of `output` against `targets`."""
    if loss == "cross_entropy":  # torch.nn.functional.cross_entropy: integer class targets
        classes = b.shape(output)[1]
        log_p = b.emit("log_softmax", [output], axis=1)
        hits = b.binary("eq", b.emit("reshape", [targets], shape=[-1, 1]),
                        b.const(np.arange(classes).reshape(1, classes), DType.int64))
        picked = b.binary("mul", log_p, b.emit("cast", [hits], dtype=b.dtype(output).value))
        return b.unary("neg", b.emit("reduce_mean", [b.emit("reduce_sum", [picked], axes=[1])]))
    if loss == "mse":
        diff = b.binary("sub", output, targets)
        return b.emit("reduce_mean", [b.binary("mul", diff, diff)])
    raise EdgerunError(f"unknown loss {loss!r}: use one of {list(LOSSES)} or the name of a scalar output")
