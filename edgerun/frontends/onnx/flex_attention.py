"""ai.onnx.preview FlexAttention: attention whose scores and probabilities pass through user graphs.

It imports as the IR's matmul / softmax / matmul, following ONNX's reference
(onnx/reference/ops/aionnx_preview/op_flex_attention.py): Q and K are each pre-scaled by sqrt(scale)
(default 1/sqrt(head size), the factor rounded to float32 then to Q's type), K and V are repeated per query
head group (GQA), and the scores are computed in the softmax precision (float32 for float16 inputs). The
`score_mod` and `prob_mod` attributes are graphs from the whole score (probability) tensor to one of the same
shape: each is inlined in place (control_flow.inline_graph), so its nodes import like any other.
"""

from __future__ import annotations

import numpy as np

from edgerun.frontends.onnx.context import ONNX_TO_DTYPE, ImportContext, OnnxNode
from edgerun.frontends.onnx.control_flow import ImportInto, inline_graph
from edgerun.ir.dtypes import DType


def _repeat_heads(ctx: ImportContext, x: str, repeat: int) -> str:
    """np.repeat(x, repeat, axis=1) on a rank-4 value: each head `repeat` times in a row."""
    b, h, s, e = ctx.b.shape(x)
    one = ctx.emit("reshape", [x], shape=[b, h, 1, s, e])
    return ctx.emit("reshape", [ctx.emit("concat", [one] * repeat, axis=2)], shape=[b, h * repeat, s, e])


def _mod(ctx: ImportContext, node: OnnxNode, key: str, x: str, import_into: ImportInto) -> str:
    """`x` through the graph attribute `key`, inlined; `x` itself when the attribute is absent."""
    graph = node.attr(key)
    if graph is None:
        return x
    if len(graph.input) != 1 or len(graph.output) != 1:
        raise node.refuse(f"{key} takes {len(graph.input)} inputs and gives {len(graph.output)} outputs "
                          "(one and one)")
    name = f"{node.name or node.outputs[0]}/{key}"
    ctx.values[f"{name}/in"] = x
    (out,) = inline_graph(ctx, graph, name, import_into, inputs=[f"{name}/in"])
    result = ctx.value(out)
    if ctx.b.shape(result) != ctx.b.shape(x):
        raise node.refuse(f"{key} changes the shape {ctx.b.shape(x)} to {ctx.b.shape(result)}")
    return ctx.cast(result, ctx.b.dtype(x))


def import_flex_attention(ctx: ImportContext, node: OnnxNode, import_into: ImportInto) -> None:
    q, k, v = (ctx.input(node, i) for i in range(3))
    shapes = [ctx.b.shape(t) for t in (q, k, v)]
    if any(len(s) != 4 for s in shapes):
        raise node.refuse(f"FlexAttention takes rank-4 Q, K, V, got shapes {shapes}")
    dtype = ctx.b.dtype(q)
    if not dtype.is_float or dtype.is_narrow:
        raise node.refuse(f"FlexAttention on {dtype.value}")
    (_, hq, _, e), (_, hkv, s, ek), (_, hv, sv, _) = shapes
    if hkv != hv or s != sv or e != ek:
        raise node.refuse(f"FlexAttention shapes do not fit: Q {shapes[0]}, K {shapes[1]}, V {shapes[2]}")
    if hq != hkv:
        if not isinstance(hq, int) or not isinstance(hkv, int) or hq % hkv:
            raise node.refuse(f"FlexAttention with {hq} query heads over {hkv} key/value heads (grouping needs "
                              "static head counts, the first a multiple of the second)")
        k, v = _repeat_heads(ctx, k, hq // hkv), _repeat_heads(ctx, v, hq // hkv)
    scale = node.attr("scale")
    if scale is None and not isinstance(e, int):
        # 1/sqrt(E) from the head size at run time (a constant once the program is specialised to its shapes)
        size = ctx.cast(ctx.value_of_sizes(np.array(e, dtype=object)), DType.float32)
        root = ctx.cast(ctx.emit("sqrt", [ctx.emit("rsqrt", [size])]), dtype)
    else:
        scale = 1.0 / np.sqrt(e) if scale is None else float(scale)
        root = ctx.b.const(np.sqrt(np.float32(scale)), dtype)
    kt = ctx.emit("transpose", [ctx.emit("mul", [k, root])], perm=[0, 1, 3, 2])
    scores = ctx.emit("matmul", [ctx.emit("mul", [q, root]), kt])
    precision = node.attr("softmax_precision")
    if precision is not None:
        if int(precision) not in ONNX_TO_DTYPE or not ONNX_TO_DTYPE[int(precision)].is_float:
            raise node.refuse(f"softmax_precision {precision}")
        compute = ONNX_TO_DTYPE[int(precision)]
    else:
        compute = DType.float32 if dtype.itemsize < 4 else dtype
    scores = _mod(ctx, node, "score_mod", ctx.cast(scores, compute), import_into)
    shifted = ctx.emit("sub", [scores, ctx.emit("reduce_max", [scores], axes=[-1], keepdims=True)])
    exp = ctx.emit("exp", [shifted])
    probs = ctx.emit("div", [exp, ctx.emit("reduce_sum", [exp], axes=[-1], keepdims=True)])
    probs = _mod(ctx, node, "prob_mod", probs, import_into)
    out = ctx.emit("matmul", [probs, ctx.cast(v, compute)])
    ctx.values[node.outputs[0]] = ctx.cast(out, ctx.b.dtype(v))
