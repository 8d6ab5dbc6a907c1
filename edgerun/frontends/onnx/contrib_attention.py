"""ONNX Runtime's attention ops (domain com.microsoft), written with the IR's matmul and
scaled_dot_product_attention composite:

- Attention: one packed projection input @ weights + bias into Q, K, V (split by qkv_hidden_sizes, equal
  thirds by default), num_heads heads, an optional mask, optional causal (unidirectional) masking. Masked
  scores get mask_filter_value added (-10000 by default, not -inf: ORT's choice, so a fully masked row
  averages its values instead of producing NaN). Mask forms: [B] key lengths, [2B] end and start
  positions, [B, T] or [B, S, T] keep-masks (0 masks), an all-broadcast dummy [1, 1] / [B, 1].
- QAttention: the same, its projection an exact integer matmul of the 8-bit input and weights (zero
  points subtracted), scaled by input_scale * weight_scale.
- RotaryEmbedding: rotate pairs (interleaved, or the two halves) of each head by the cached cos/sin at
  each token's position.
- GroupQueryAttention, first call (no past key/value): separate Q, K, V; kv_num_heads key/value heads each
  shared by num_heads / kv_num_heads query heads; causal, with keys past each row's seqlens_k masked.

Semantics from ORT's ContribOperators.md; tests/onnx/test_onnx_contrib_ops.py compares with ORT's kernels.
"""

from __future__ import annotations

import math

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.nn import matmul_nd
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType


def _heads(ctx: ImportContext, x: str, heads: int) -> str:
    """[B, S, N*H] -> [B, N, S, H]."""
    b, s, width = ctx.b.shape(x)
    return ctx.emit("transpose", [ctx.emit("reshape", [x], shape=[b, s, heads, width // heads])], perm=[0, 2, 1, 3])


def _merge_heads(ctx: ImportContext, y: str) -> str:
    b, n, s, h = ctx.b.shape(y)
    return ctx.emit("reshape", [ctx.emit("transpose", [y], perm=[0, 2, 1, 3])], shape=[b, s, n * h])


def _keep_mask(ctx: ImportContext, node: OnnxNode, mask: str, batch: int, seq: int, total: int) -> str | None:
    """The mask input as a boolean keep-mask broadcastable to [B, 1, S, T]; None for a dummy mask."""
    shape = ctx.b.shape(mask)
    mask = ctx.cast(mask, DType.int32)
    keys = ctx.b.const(np.arange(total, dtype=np.int32).reshape(1, total))
    if len(shape) == 1:
        if shape[0] == batch:  # key lengths: keys at or past the length are masked
            keep = ctx.emit("lt", [keys, ctx.emit("reshape", [mask], shape=[batch, 1])])
        elif isinstance(batch, int) and shape[0] == 2 * batch:  # end positions, then start positions
            end = ctx.emit("reshape", [ctx.emit("slice", [mask], starts=[0], ends=[batch], axes=[0])], shape=[batch, 1])
            start = ctx.emit("reshape", [ctx.emit("slice", [mask], starts=[batch], ends=[2 * batch], axes=[0])],
                             shape=[batch, 1])
            keep = ctx.emit("logical_and", [ctx.emit("lt", [keys, end]), ctx.emit("ge", [keys, start])])
        else:
            raise node.refuse(f"a 1-D mask_index of shape {shape}")
        return ctx.emit("reshape", [keep], shape=[batch, 1, 1, total])
    if len(shape) == 2:
        if shape[1] == 1 and total != 1:  # ORT's dummy mask: no masking
            return None
        return ctx.emit("reshape", [ctx.emit("gt", [mask, ctx.b.const(np.int32(0))])], shape=[shape[0], 1, 1, total])
    if len(shape) == 3:
        return ctx.emit("reshape", [ctx.emit("gt", [mask, ctx.b.const(np.int32(0))])], shape=[shape[0], 1, seq, total])
    raise node.refuse(f"a {len(shape)}-D mask_index (1-D, 2-D and 3-D are supported)")


def _attend(ctx: ImportContext, node: OnnxNode, q: str, k: str, v: str, heads: int, kv_heads: int,
            keep: str | None, causal: bool, filter_value: float, scale: float) -> str:
    """softmax(q k^T * scale + (masked ? filter_value : 0)) v over heads; q, k, v [B, S, width]."""
    qh, kh, vh = _heads(ctx, q, heads), _heads(ctx, k, kv_heads), _heads(ctx, v, kv_heads)
    if kv_heads != heads:  # each key/value head serves heads / kv_heads query heads in a row
        group = heads // kv_heads
        b, _, t, h = ctx.b.shape(kh)
        kh, vh = (ctx.emit("reshape", [ctx.emit("expand", [ctx.emit("reshape", [x], shape=[b, kv_heads, 1, t, h])],
                                                 shape=[b, kv_heads, group, t, h])], shape=[b, heads, t, h])
                  for x in (kh, vh))
    seq, total = ctx.b.shape(qh)[2], ctx.b.shape(kh)[2]
    if causal:
        if not (isinstance(seq, int) and isinstance(total, int)):
            raise node.refuse("causal attention over a symbolic sequence length")
        past = total - seq
        lower = np.arange(total)[None, :] <= np.arange(seq)[:, None] + past
        causal_keep = ctx.b.const(lower.reshape(1, 1, seq, total))
        keep = causal_keep if keep is None else ctx.emit("logical_and", [keep, causal_keep])
    ins = [qh, kh, vh]
    if keep is not None:
        ins.append(ctx.emit("where", [keep, ctx.scalar(0.0, q), ctx.scalar(filter_value, q)]))
    return _merge_heads(ctx, ctx.emit("scaled_dot_product_attention", ins, scale=scale))


def _split_qkv(ctx: ImportContext, node: OnnxNode, qkv: str) -> tuple[str, str, str]:
    width = ctx.b.shape(qkv)[-1]
    sizes = [int(s) for s in node.attr("qkv_hidden_sizes", [])] or [width // 3] * 3
    if sum(sizes) != width or sizes[0] != sizes[1]:
        raise node.refuse(f"qkv_hidden_sizes {sizes} for a projection of width {width}")
    bounds = np.cumsum([0, *sizes])
    q, k, v = (ctx.emit("slice", [qkv], starts=[int(bounds[i])], ends=[int(bounds[i + 1])], axes=[2])
               for i in range(3))
    return q, k, v


def _self_attention(ctx: ImportContext, node: OnnxNode, qkv: str, mask_at: int, past_at: int) -> list[Out]:
    if node.has_input(past_at) or node.attr("do_rotary", 0) or node.attr("past_present_share_buffer", 0):
        raise node.refuse("past key/value state or rotary embedding inside Attention")
    if len(node.outputs) > 1 and node.outputs[1]:
        raise node.refuse("the present key/value output")
    heads = int(node.attr("num_heads"))
    q, k, v = _split_qkv(ctx, node, qkv)
    batch, seq, _ = ctx.b.shape(q)
    keep = _keep_mask(ctx, node, ctx.input(node, mask_at), batch, seq, seq) if node.has_input(mask_at) else None
    head_size = ctx.b.shape(q)[-1] // heads
    scale = node.float_attr("scale", 0.0) or 1.0 / math.sqrt(head_size)
    return [_attend(ctx, node, q, k, v, heads, heads, keep, bool(node.attr("unidirectional", 0)),
                    node.float_attr("mask_filter_value", -10000.0), scale)]


@onnx_op("com.microsoft:Attention")
def attention(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    if node.has_input(5):
        raise node.refuse("an attention_bias (relative position bias) input")
    qkv = matmul_nd(ctx, ctx.input(node, 0), ctx.input(node, 1))
    if node.has_input(2):
        qkv = ctx.emit("add", [qkv, ctx.input(node, 2)])
    return _self_attention(ctx, node, qkv, 3, 4)


@onnx_op("com.microsoft:QAttention")
def q_attention(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x, w = ctx.input(node, 0), ctx.input(node, 1)
    x_zp = ctx.input(node, 6) if node.has_input(6) else ctx.b.const(np.zeros((), ctx.b.dtype(x).np))
    w_zp = ctx.input(node, 7) if node.has_input(7) else ctx.b.const(np.zeros((), ctx.b.dtype(w).np))
    if ctx.b.spec(x_zp).numel != 1:
        raise node.refuse("a per-row input zero point")
    x_zp = ctx.emit("reshape", [x_zp], shape=[])
    if ctx.b.spec(w_zp).numel == 1:
        w_zp = ctx.emit("reshape", [w_zp], shape=[])
    acc = matmul_nd(ctx, x, w, "matmul_integer", [x_zp, w_zp])
    scale = ctx.emit("mul", [ctx.cast(ctx.input(node, 3), DType.float32), ctx.cast(ctx.input(node, 4), DType.float32)])
    qkv = ctx.emit("add", [ctx.emit("mul", [ctx.cast(acc, DType.float32), scale]), ctx.input(node, 2)])
    return _self_attention(ctx, node, qkv, 5, 8)


def rotate(ctx: ImportContext, x: str, cos: str, sin: str, interleaved: bool, dim: int) -> str:
    """x [B, N, S, H]: its first `dim` channels rotated by cos/sin [B or 1, 1, S, dim/2]."""
    b, n, s, h = ctx.b.shape(x)
    half = dim // 2
    rot = ctx.emit("slice", [x], starts=[0], ends=[dim], axes=[3]) if dim < h else x
    if interleaved:
        pairs = ctx.emit("reshape", [rot], shape=[b, n, s, half, 2])
        x1 = ctx.emit("reshape", [ctx.emit("slice", [pairs], starts=[0], ends=[1], axes=[4])], shape=[b, n, s, half])
        x2 = ctx.emit("reshape", [ctx.emit("slice", [pairs], starts=[1], ends=[2], axes=[4])], shape=[b, n, s, half])
    else:
        x1 = ctx.emit("slice", [rot], starts=[0], ends=[half], axes=[3])
        x2 = ctx.emit("slice", [rot], starts=[half], ends=[dim], axes=[3])
    y1 = ctx.emit("sub", [ctx.emit("mul", [x1, cos]), ctx.emit("mul", [x2, sin])])
    y2 = ctx.emit("add", [ctx.emit("mul", [x2, cos]), ctx.emit("mul", [x1, sin])])
    if interleaved:
        y = ctx.emit("reshape", [ctx.emit("concat", [ctx.emit("reshape", [y1], shape=[b, n, s, half, 1]),
                                                    ctx.emit("reshape", [y2], shape=[b, n, s, half, 1])], axis=4)],
                     shape=[b, n, s, dim])
    else:
        y = ctx.emit("concat", [y1, y2], axis=3)
    return ctx.emit("concat", [y, ctx.emit("slice", [x], starts=[dim], ends=[h], axes=[3])], axis=3) if dim < h else y


def _cos_sin_at(ctx: ImportContext, positions: str, cos_cache: str, sin_cache: str) -> tuple[str, str]:
    """cos/sin rows at `positions` [B, S], shaped [B, 1, S, dim/2]."""
    cos, sin = (ctx.emit("gather", [c, ctx.cast(positions, DType.int64)], axis=0) for c in (cos_cache, sin_cache))
    b, s, half = ctx.b.shape(cos)
    return tuple(ctx.emit("reshape", [c], shape=[b, 1, s, half]) for c in (cos, sin))  # type: ignore[return-value]


@onnx_op("com.microsoft:RotaryEmbedding")
def rotary_embedding(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x, positions = ctx.input(node, 0), ctx.input(node, 1)
    shape = ctx.b.shape(x)
    half = ctx.b.shape(ctx.input(node, 2))[-1]
    if len(shape) == 4:  # [B, N, S, H]
        xh = x
    elif len(shape) == 3:  # [B, S, N*H]
        heads = int(node.attr("num_heads", 0)) or shape[2] // (int(node.attr("rotary_embedding_dim", 0)) or 2 * half)
        xh = _heads(ctx, x, heads)
    else:
        raise node.refuse(f"an input of rank {len(shape)}")
    s, h = ctx.b.shape(xh)[2:]
    dim = int(node.attr("rotary_embedding_dim", 0)) or h
    if ctx.b.spec(positions).numel == 1 and ctx.b.shape(positions) in ((1,), ()):  # a start offset
        if not isinstance(s, int):
            raise node.refuse("a position offset with a symbolic sequence length")
        positions = ctx.emit("add", [ctx.emit("reshape", [ctx.cast(positions, DType.int64)], shape=[1, 1]),
                                     ctx.b.const(np.arange(s, dtype=np.int64).reshape(1, s))])
    cos, sin = _cos_sin_at(ctx, positions, ctx.input(node, 2), ctx.input(node, 3))
    y = rotate(ctx, xh, cos, sin, bool(node.attr("interleaved", 0)), dim)
    return [y if len(shape) == 4 else _merge_heads(ctx, y)]


@onnx_op("com.microsoft:GroupQueryAttention")
def group_query_attention(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    if not node.has_input(1) or not node.has_input(2):
        raise node.refuse("a packed QKV input (separate query, key and value are supported)")
    if node.has_input(3) or node.has_input(4):
        past = ctx.b.shape(ctx.input(node, 3)) if node.has_input(3) else ()
        if not past or past[2] != 0:
            raise node.refuse("a past key/value cache (the first call, with an empty or no past, is supported)")
    if node.attr("local_window_size", -1) not in (-1,) or node.attr("softcap", 0.0):
        raise node.refuse("local_window_size or softcap")
    heads, kv_heads = int(node.attr("num_heads")), int(node.attr("kv_num_heads"))
    q, k, v = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    batch, seq, width = ctx.b.shape(q)
    head = width // heads
    if node.attr("do_rotary", 0):
        if not isinstance(seq, int):
            raise node.refuse("rotary embedding with a symbolic sequence length")
        positions = ctx.b.const(np.broadcast_to(np.arange(seq, dtype=np.int64), (1, seq)).copy())
        cos, sin = _cos_sin_at(ctx, positions, ctx.input(node, 7), ctx.input(node, 8))
        dim = 2 * ctx.b.shape(ctx.input(node, 7))[-1]
        inter = bool(node.attr("rotary_interleaved", 0))
        q = _merge_heads(ctx, rotate(ctx, _heads(ctx, q, heads), cos, sin, inter, dim))
        k = _merge_heads(ctx, rotate(ctx, _heads(ctx, k, kv_heads), cos, sin, inter, dim))
    # seqlens_k holds each row's key count minus one: keys beyond it are padding.
    lengths = ctx.emit("add", [ctx.cast(ctx.input(node, 5), DType.int32), ctx.b.const(np.int32(1))])
    keep = _keep_mask(ctx, node, lengths, batch, seq, seq)
    scale = node.float_attr("scale", 0.0) or 1.0 / math.sqrt(head)
    y = _attend(ctx, node, q, k, v, heads, kv_heads, keep, True, float(np.finfo(np.float32).min), scale)
    # present_key / present_value: this call's keys (rotated) and values, [B, kv_heads, S, H].
    return [y, _heads(ctx, k, kv_heads), _heads(ctx, v, kv_heads)]
