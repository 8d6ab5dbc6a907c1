"""`cache_attention`: a decoder layer's attention against its KV cache, the cache read and written, as one op.

    out, k_cache', v_cache' = cache_attention(q, k, v, k_cache, v_cache, start[, cos, sin])

q [T, heads * head_dim], k and v [T, kv_heads * head_dim]: the projections' outputs for T tokens at positions
start .. start + T - 1 (QK-norm, where a model has it, already applied). With the rotary tables cos and sin
[P, rotary_dim] (rotate-half, rows by position, clamped to P - 1), q and k turn by the rows of their
positions (only the first rotary_dim dims of each head: partial rotary). Query heads share key/value heads
in groups side by side (transformers' repeat_kv order). Each query attends to the cache cells before
`start` and to the chunk's own rows up to itself (causal); with attr `window` W > 0 only to keys at
positions p - W < j <= p. Scores are `scale` * q.k (default 1 / sqrt(head_dim)), soft-capped to
softcap * tanh(s / softcap) when attr `softcap` > 0. out [T, heads * head_dim]; k_cache' and v_cache' are
the caches with the T new rows (rotated keys, values) written at `start` (update_slice: clamped so they fit).

Cache layouts (attr `layout`): "heads": both [B, kv_heads, C, head_dim] (ONNX Runtime's GroupQueryAttention
layout); "keys_transposed": k_cache [kv_heads, head_dim, C] (the score matmul reads it untransposed) and
v_cache [kv_heads, C, head_dim]. Cells at positions >= start are masked out; they must hold finite values
(0 * NaN is NaN).

Several sequences at once (a batched decode): with "heads" caches of B > 1 sequences, `start` holds B
positions, one per sequence, and q, k, v hold B * T rows, sequence after sequence (T per sequence). Each
sequence attends to its own cache rows before its own start and writes its T rows there; nothing crosses
between sequences. B = 1 is the single-sequence op above.

A backend runs it as one kernel where it has one (ONNX Runtime's GroupQueryAttention, appending the rows
in place); everywhere else the decomposition below is what runs. Its gradient is its decomposition's.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerun.ir.builder import Builder, absent
from edgerun.ir.dtypes import DType
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.tensor_spec import TensorSpec

Attrs = dict[str, Any]
LAYOUTS = ("heads", "keys_transposed")


def cache_shapes(layout: str, kv_heads: int, cells: int, head_dim: int, sequences: int = 1,
                 ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(k_cache, v_cache) shapes of `layout` (`sequences` > 1: "heads" only)."""
    if layout == "heads":
        return (sequences, kv_heads, cells, head_dim), (sequences, kv_heads, cells, head_dim)
    return (kv_heads, head_dim, cells), (kv_heads, cells, head_dim)


def _rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    q, k, v, k_cache, v_cache, start = ins[:6]
    hd, layout = int(attrs.get("head_dim", 0)), attrs.get("layout", "heads")
    if layout not in LAYOUTS:
        raise ValueError(f"cache_attention layout must be one of {LAYOUTS}, got {layout!r}")
    if any(x.dtype is not DType.float32 for x in (q, k, v, k_cache, v_cache)):
        raise ValueError("cache_attention runs on float32 tensors")
    if hd <= 0 or q.rank != 2 or k.shape != v.shape or k.rank != 2 or k.shape[0] != q.shape[0] \
            or q.shape[1] % hd or k.shape[1] % hd or (q.shape[1] // hd) % max(k.shape[1] // hd, 1) or not k.shape[1]:
        raise ValueError(f"cache_attention needs q [T, heads*{hd}], k and v [T, kv_heads*{hd}] with heads a "
                         f"multiple of kv_heads; got {q}, {k}, {v}")
    kv = k.shape[1] // hd
    cells = k_cache.shape[2] if k_cache.rank in (3, 4) else -1
    batch = k_cache.shape[0] if layout == "heads" and k_cache.rank == 4 else 1
    if batch < 1 or q.shape[0] % batch:
        raise ValueError(f"cache_attention over {batch} sequences needs q rows a multiple of {batch}, got {q}")
    rows = q.shape[0] // batch
    want = cache_shapes(layout, kv, cells, hd, batch)
    if (k_cache.shape, v_cache.shape) != want or cells < rows:
        raise ValueError(f"cache_attention's {layout} caches must be {want[0]} and {want[1]} with at least "
                         f"{rows} cells; got {k_cache}, {v_cache}")
    if start.dtype not in (DType.int32, DType.int64) or start.numel != batch:
        raise ValueError(f"cache_attention start must be {batch} int32 or int64 value(s) (one per sequence), "
                         f"got {start}")
    tables = [x for x in ins[6:8] if not absent(x)]
    if tables and (len(tables) != 2 or tables[0].shape != tables[1].shape or tables[0].rank != 2
                   or tables[0].shape[1] % 2 or not 0 < tables[0].shape[1] <= hd
                   or any(t.dtype is not DType.float32 for t in tables)):
        raise ValueError(f"cache_attention's rotary tables must be two float32 [positions, rotary_dim] with an "
                         f"even rotary_dim <= {hd}; got {tables}")
    return [TensorSpec(q.shape, DType.float32), k_cache, v_cache]


def _rotate(b: Builder, x: str, cos: str, sin: str, rd: int, hd: int) -> str:
    """x * cos + rotate_half(x) * sin on [..., T, hd]; with partial rotary only the first rd dims of each head
    turn, the rest pass through (transformers' order)."""
    axis = len(b.shape(x)) - 1
    x_rot = x if rd == hd else b.emit("slice", [x], starts=[0], ends=[rd], axes=[axis])
    x1 = b.emit("slice", [x_rot], starts=[0], ends=[rd // 2], axes=[axis])
    x2 = b.emit("slice", [x_rot], starts=[rd // 2], ends=[rd], axes=[axis])
    rotated = b.emit("concat", [b.unary("neg", x2), x1], axis=axis)
    out = b.binary("add", b.binary("mul", x_rot, cos), b.binary("mul", rotated, sin))
    if rd == hd:
        return out
    return b.emit("concat", [out, b.emit("slice", [x], starts=[rd], ends=[hd], axes=[axis])], axis=axis)


def _softcap(b: Builder, x: str, cap: float) -> str:
    if not cap:
        return x
    return b.binary("mul", b.unary("tanh", b.binary("div", x, b.scalar(cap, x))), b.scalar(cap, x))


def _cache_attention(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    q, k, v, k_cache, v_cache, start = ins[:6]
    hd, layout = int(attrs["head_dim"]), attrs.get("layout", "heads")
    if layout == "heads" and b.shape(k_cache)[0] > 1:
        return _batched_cache_attention(b, ins, attrs)
    T, heads, kv = b.shape(q)[0], b.shape(q)[1] // hd, b.shape(k)[1] // hd
    group, C = heads // kv, b.shape(k_cache)[2]
    scale = attrs.get("scale")
    scale = float(np.float32(1.0 / np.sqrt(hd) if scale is None else scale))
    window, cap = int(attrs.get("window", 0) or 0), float(attrs.get("softcap", 0.0) or 0.0)
    index = b.dtype(start).np

    def heads_first(x: str, n: int) -> str:  # [T, n * hd] -> [n, T, hd]
        return b.emit("transpose", [b.emit("reshape", [x], shape=[T, n, hd])], perm=[1, 0, 2])

    q, k, v = heads_first(q, heads), heads_first(k, kv), heads_first(v, kv)
    positions = b.binary("add", b.const(np.arange(T, dtype=index)), start)
    tables = [x for x in ins[6:8] if x]
    if tables:
        cos_table, sin_table = tables
        # Padding rows past the tables read their last row; their outputs are never used.
        positions = b.binary("minimum", positions, b.const(np.asarray(b.shape(cos_table)[0] - 1, index)))
        cos, sin = (b.emit("gather", [t, positions], axis=0) for t in (cos_table, sin_table))  # [T, rotary_dim]
        rd = b.shape(cos_table)[1]
        q, k = _rotate(b, q, cos, sin, rd, hd), _rotate(b, k, cos, sin, rd, hd)
    if layout == "heads":  # [1, kv, C, hd] both; the new rows [1, kv, T, hd]
        keys = b.emit("transpose", [b.emit("reshape", [k_cache], shape=[kv, C, hd])], perm=[0, 2, 1])
        values = b.emit("reshape", [v_cache], shape=[kv, C, hd])
        k_new = b.emit("transpose", [k], perm=[0, 2, 1])  # [kv, hd, T], for this chunk's scores
        k_rows, v_rows = b.emit("reshape", [k], shape=[1, kv, T, hd]), b.emit("reshape", [v], shape=[1, kv, T, hd])
        k_axis, v_axis = 2, 2
    else:
        keys, values = k_cache, v_cache
        k_new = k_rows = b.emit("transpose", [k], perm=[0, 2, 1])  # [kv, hd, T]
        v_rows, k_axis, v_axis = v, 2, 1
    cells = b.const(np.arange(C, dtype=index))
    keep = b.emit("reshape", [b.binary("lt", cells, start)], shape=[1, 1, C])
    causal = np.tril(np.ones((T, T), dtype=bool))
    if window:  # a query at position p sees keys p - W < j <= p
        rows = b.binary("add", b.const(np.tile(np.arange(T, dtype=index), group)[:, None]), start)
        in_window = b.binary("lt", b.binary("sub", rows, b.emit("reshape", [cells], shape=[1, C])),
                             b.const(np.asarray(window, index)))  # [group*T, C]
        keep = b.emit("reshape", [b.binary("logical_and", in_window, keep)], shape=[1, group * T, C])
        causal &= np.subtract.outer(np.arange(T), np.arange(T)) < window
    # Query heads sharing a key/value head sit side by side, so grouped attention is one batched matmul per
    # kv head with group*T query rows.
    q = b.binary("mul", q, b.scalar(scale, q))
    q_grouped = b.emit("reshape", [q], shape=[kv, group * T, hd])
    neg_inf = b.const(np.float32(-np.inf))
    s_cache = b.emit("where", [keep, _softcap(b, b.emit("matmul", [q_grouped, keys]), cap), neg_inf])
    s_new = b.emit("where", [b.const(np.tile(causal, (group, 1))),
                             _softcap(b, b.emit("matmul", [q_grouped, k_new]), cap), neg_inf])
    probs = b.emit("softmax", [b.emit("concat", [s_cache, s_new], axis=2)], axis=2)
    p_cache = b.emit("slice", [probs], starts=[0], ends=[C], axes=[2])
    p_new = b.emit("slice", [probs], starts=[C], ends=[C + T], axes=[2])
    out = b.binary("add", b.emit("matmul", [p_cache, values]), b.emit("matmul", [p_new, v]))
    out = b.emit("transpose", [b.emit("reshape", [out], shape=[heads, T, hd])], perm=[1, 0, 2])
    out = b.emit("reshape", [out], shape=[T, heads * hd])
    # The writes come after every read of the old cache: a state's buffer is updated in place.
    return [out, b.emit("update_slice", [k_cache, k_rows, start], axis=k_axis),
            b.emit("update_slice", [v_cache, v_rows, start], axis=v_axis)]


def _batched_cache_attention(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    """B sequences in "heads" caches [B, kv, C, hd], each at its own start: the single-sequence decomposition
    with a leading sequence axis (masks per sequence), and each sequence's rows written at its own start (clamped
    as update_slice clamps) by a one-hot [C, T] matmul and a where (exact: one product by 1.0 per cell)."""
    q, k, v, k_cache, v_cache, start = ins[:6]
    hd = int(attrs["head_dim"])
    B, kv, C, _ = b.shape(k_cache)
    rows, heads = b.shape(q)[0], b.shape(q)[1] // hd
    T, group = rows // B, heads // kv
    scale = attrs.get("scale")
    scale = float(np.float32(1.0 / np.sqrt(hd) if scale is None else scale))
    window, cap = int(attrs.get("window", 0) or 0), float(attrs.get("softcap", 0.0) or 0.0)
    index = b.dtype(start).np

    def heads_first(x: str, n: int) -> str:  # [B * T, n * hd] -> [B, n, T, hd]
        return b.emit("transpose", [b.emit("reshape", [x], shape=[B, T, n, hd])], perm=[0, 2, 1, 3])

    q, k, v = heads_first(q, heads), heads_first(k, kv), heads_first(v, kv)
    starts = b.emit("reshape", [start], shape=[B, 1])
    positions = b.binary("add", starts, b.const(np.arange(T, dtype=index).reshape(1, T)))  # [B, T]
    tables = [x for x in ins[6:8] if x]
    if tables:
        cos_table, sin_table = tables
        positions = b.binary("minimum", positions, b.const(np.asarray(b.shape(cos_table)[0] - 1, index)))
        rd = b.shape(cos_table)[1]
        cos, sin = (b.emit("reshape", [b.emit("gather", [t, positions], axis=0)], shape=[B, 1, T, rd])
                    for t in (cos_table, sin_table))
        q, k = _rotate(b, q, cos, sin, rd, hd), _rotate(b, k, cos, sin, rd, hd)
    keys = b.emit("transpose", [k_cache], perm=[0, 1, 3, 2])  # [B, kv, hd, C]
    k_new = b.emit("transpose", [k], perm=[0, 1, 3, 2])  # [B, kv, hd, T]
    cells = b.const(np.arange(C, dtype=index).reshape(1, C))
    keep = b.emit("reshape", [b.binary("lt", cells, starts)], shape=[B, 1, 1, C])
    causal = np.tril(np.ones((T, T), dtype=bool))
    if window:  # a query at position p sees keys p - W < j <= p
        query_rows = b.emit("reshape", [b.emit("concat", [positions] * group, axis=1)], shape=[B, group * T, 1])
        in_window = b.binary("lt", b.binary("sub", query_rows, b.emit("reshape", [cells], shape=[1, 1, C])),
                             b.const(np.asarray(window, index)))  # [B, group*T, C]
        keep = b.emit("reshape", [b.binary("logical_and", in_window, b.emit("reshape", [keep], shape=[B, 1, C]))],
                      shape=[B, 1, group * T, C])
        causal &= np.subtract.outer(np.arange(T), np.arange(T)) < window
    q = b.binary("mul", q, b.scalar(scale, q))
    q_grouped = b.emit("reshape", [q], shape=[B, kv, group * T, hd])
    neg_inf = b.const(np.float32(-np.inf))
    s_cache = b.emit("where", [keep, _softcap(b, b.emit("matmul", [q_grouped, keys]), cap), neg_inf])
    s_new = b.emit("where", [b.const(np.tile(causal, (group, 1))),
                             _softcap(b, b.emit("matmul", [q_grouped, k_new]), cap), neg_inf])
    probs = b.emit("softmax", [b.emit("concat", [s_cache, s_new], axis=3)], axis=3)
    p_cache = b.emit("slice", [probs], starts=[0], ends=[C], axes=[3])
    p_new = b.emit("slice", [probs], starts=[C], ends=[C + T], axes=[3])
    out = b.binary("add", b.emit("matmul", [p_cache, v_cache]), b.emit("matmul", [p_new, v]))
    out = b.emit("transpose", [b.emit("reshape", [out], shape=[B, heads, T, hd])], perm=[0, 2, 1, 3])
    out = b.emit("reshape", [out], shape=[rows, heads * hd])
    # Row t of sequence s goes to cell clamp(start[s], 0, C - T) + t.
    first = b.binary("minimum", b.binary("maximum", starts, b.const(np.zeros((), index))),
                     b.const(np.asarray(C - T, index)))  # [B, 1]
    targets = b.binary("add", first, b.const(np.arange(T, dtype=index).reshape(1, T)))  # [B, T]
    hits = b.binary("eq", b.emit("reshape", [cells], shape=[1, C, 1]), b.emit("reshape", [targets], shape=[B, 1, T]))
    one_hot = b.emit("reshape", [b.emit("cast", [hits], dtype="float32")], shape=[B, 1, C, T])
    written = b.emit("reshape", [b.emit("reduce_sum", [one_hot], axes=[3], keepdims=True)], shape=[B, 1, C, 1])
    written = b.binary("gt", written, b.scalar(0.5, written))
    return [out, b.emit("where", [written, b.emit("matmul", [one_hot, k]), k_cache]),
            b.emit("where", [written, b.emit("matmul", [one_hot, v]), v_cache])]


register(OpDef("cache_attention", OpKind.COMPOSITE, _rule, 6, 8, decompose=_cache_attention,
               doc="a decoder layer's grouped-query attention against its KV cache (optional rotary tables, "
                   "sliding window, soft-cap; the new rows written at start; B sequences in 'heads' caches "
                   "[B, ...] with B starts): out, k_cache', v_cache'"))
