"""ONNX Runtime's fused normalisations (com.microsoft, and SimplifiedLayerNormalization, which ORT registers in
the default domain: ort_domains.py moves it), as its transformer optimizer emits them for BERT and LLaMA-style models:

- SkipLayerNormalization: layer norm of input + skip (+ bias) over the last axis; optional outputs mean,
  1/std and the sum itself (which the next block's residual reads).
- SkipSimplifiedLayerNormalization / SimplifiedLayerNormalization: the same with RMS normalisation.
- EmbedLayerNormalization: word + position (+ segment) embedding lookups, then layer norm; its mask_index
  output is the count of ones in each row of the mask (the key length Attention takes);
  QEmbedLayerNormalization: the same over 8-bit tables (dequantized first).

All are written with the IR's existing ops. Semantics from ORT's ContribOperators.md; the node tests
(tests/onnx/test_onnx_contrib_ops.py) compare with ONNX Runtime's kernels.
"""

from __future__ import annotations

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType


def _normalise(ctx: ImportContext, x: str, axes: list[int], eps: float, rms: bool) -> tuple[str, str, str]:
    """(normalised x, mean, 1/std) over axes, statistics with unit dims; rms: no centring (mean is zero)."""
    if rms:
        ms = ctx.emit("reduce_mean", [ctx.emit("mul", [x, x])], axes=axes, keepdims=True)
        inv = ctx.emit("rsqrt", [ctx.emit("add", [ms, ctx.scalar(eps, ms)])])
        return ctx.emit("mul", [x, inv]), ctx.b.const(np.zeros(ctx.b.shape(inv), np.float32)), inv
    mean = ctx.emit("reduce_mean", [x], axes=axes, keepdims=True)
    centered = ctx.emit("sub", [x, mean])
    var = ctx.emit("reduce_mean", [ctx.emit("mul", [centered, centered])], axes=axes, keepdims=True)
    inv = ctx.emit("rsqrt", [ctx.emit("add", [var, ctx.scalar(eps, var)])])
    return ctx.emit("mul", [centered, inv]), mean, inv


def _affine(ctx: ImportContext, y: str, gamma: str, beta: str | None) -> str:
    y = ctx.emit("mul", [y, gamma])
    return ctx.emit("add", [y, beta]) if beta else y


def _skip_norm(ctx: ImportContext, node: OnnxNode, rms: bool) -> list[Out]:
    x, skip, gamma = ctx.input(node, 0), ctx.input(node, 1), ctx.input(node, 2)
    beta_at, bias_at = (None, 3) if rms else (3, 4)
    total = ctx.emit("add", [x, skip])
    if node.has_input(bias_at):
        total = ctx.emit("add", [total, ctx.input(node, bias_at)])
    rank = len(ctx.b.shape(total))
    y, mean, inv = _normalise(ctx, total, [rank - 1], node.float_attr("epsilon", 1e-12), rms)
    beta = ctx.input(node, beta_at) if beta_at is not None and node.has_input(beta_at) else None
    return [_affine(ctx, y, gamma, beta), mean, inv, total]


@onnx_op("com.microsoft:SkipLayerNormalization")
def skip_layer_norm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return _skip_norm(ctx, node, rms=False)


@onnx_op("com.microsoft:SkipSimplifiedLayerNormalization")
def skip_simplified_layer_norm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return _skip_norm(ctx, node, rms=True)


@onnx_op("com.microsoft:SimplifiedLayerNormalization")  # ORT registers it in the default domain (ort_domains.py)
def simplified_layer_norm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    rank = len(ctx.b.shape(x))
    axis = int(node.attr("axis", -1)) % rank
    if node.attr("stash_type", 1) != 1:
        raise node.refuse("stash_type other than float32")
    dtype = ctx.b.dtype(x)
    y, _, inv = _normalise(ctx, ctx.cast(x, DType.float32), list(range(axis, rank)),
                           node.float_attr("epsilon", 1e-5), rms=True)
    return [ctx.emit("mul", [ctx.cast(y, dtype), ctx.input(node, 1)]), inv]


@onnx_op("com.microsoft:EmbedLayerNormalization")
def embed_layer_norm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    tables = [ctx.input(node, i) if node.has_input(i) else None for i in (2, 3, 4, 5, 6)]
    return _embed_layer_norm(ctx, node, tables, mask_at=7, positions_at=8)


@onnx_op("com.microsoft:QEmbedLayerNormalization")
def q_embed_layer_norm(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """EmbedLayerNormalization with 8-bit tables and gamma/beta (ORT's quantize_dynamic of it): each is
    dequantized, (q - zero_point) * scale, then as above. Inputs 8..12 are the scales, 13..17 the zero points."""
    def table(i: int) -> str | None:
        if not node.has_input(i):
            return None
        scale = ctx.emit("reshape", [ctx.cast(ctx.input(node, i + 6), DType.float32)], shape=[])
        zp = ctx.emit("reshape", [ctx.input(node, i + 11)], shape=[])
        return ctx.emit("dequantize_linear", [ctx.input(node, i), scale, zp])
    return _embed_layer_norm(ctx, node, [table(i) for i in (2, 3, 4, 5, 6)], mask_at=7, positions_at=None)


def _embed_layer_norm(ctx: ImportContext, node: OnnxNode, tables: list[str | None], mask_at: int,
                      positions_at: int | None) -> list[Out]:
    """`tables`: the word, position and segment embeddings, gamma and beta (None where absent)."""
    word, position, segment, gamma, beta = tables
    ids = ctx.input(node, 0)
    batch, seq = ctx.b.shape(ids)
    assert word and position and gamma and beta  # required inputs (ONNX's checker enforces them)
    total = ctx.emit("gather", [word, ids], axis=0)
    if positions_at is not None and node.has_input(positions_at):
        positions = ctx.input(node, positions_at)
    else:
        if not isinstance(seq, int):
            raise node.refuse("a symbolic sequence length without position_ids")
        positions = ctx.b.const(np.arange(seq, dtype=np.int32).reshape(1, seq))
    total = ctx.emit("add", [total, ctx.emit("gather", [position, positions], axis=0)])
    if node.has_input(1) and segment:
        total = ctx.emit("add", [total, ctx.emit("gather", [segment, ctx.input(node, 1)], axis=0)])
    y, _, _ = _normalise(ctx, total, [2], node.float_attr("epsilon", 1e-12), rms=False)
    out = _affine(ctx, y, gamma, beta)
    if node.has_input(mask_at):
        ones = ctx.cast(ctx.emit("eq", [ctx.input(node, mask_at), ctx.b.const(np.int32(1))]), DType.int32)
        mask_index = ctx.emit("reduce_sum", [ones], axes=[1], keepdims=False)
    else:
        mask_index = ctx.b.const(np.zeros((batch,), np.int32)) if isinstance(batch, int) else \
            ctx.cast(ctx.emit("reduce_sum", [ctx.emit("mul", [ids, ctx.b.const(np.int32(0))])], axes=[1],
                              keepdims=False), DType.int32)
    return [out, mask_index, total]
