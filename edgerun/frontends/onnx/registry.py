"""The table from ONNX op type to its import handler. Handler modules register themselves on import."""

from __future__ import annotations

from collections.abc import Callable

from edgerun.frontends.onnx.context import Handler

HANDLERS: dict[str, Handler] = {}


def onnx_op(*op_types: str) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        for op in op_types:
            if op in HANDLERS:
                raise ValueError(f"ONNX op {op!r} has two handlers")
            HANDLERS[op] = fn
        return fn
    return deco


def load_handlers() -> dict[str, Handler]:
    from edgerun.frontends.onnx import (  # noqa: F401
        activations,
        bitwise,
        contrib_activations,
        contrib_attention,
        contrib_norms,
        contrib_quantized,
        conv_pool,
        data_dependent,
        elementwise,
        grid_sample,
        image,
        indexing,
        ml,
        nn,
        quantized,
        recurrent,
        reduce,
        resize,
        shape,
        signal,
        sorting,
        strings,
        training,
        trig,
    )
    return HANDLERS
