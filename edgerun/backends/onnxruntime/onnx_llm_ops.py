"""Transformer decoders on ONNX Runtime: composites as its fused kernels (one node where the IR's
decomposition would make several).

rms_norm -> SimplifiedLayerNormalization (ORT's RMSNorm, registered in the default ONNX domain): one kernel
instead of the six nodes of its decomposition (Mul, ReduceMean, Add, Sqrt, Reciprocal, Mul, then the
weight's Mul). A decoder layer has two, so a 30-layer LLM step loses about 300 nodes. (The ORT profile shows the
residual Add before one not fused into SkipSimplifiedLayerNormalization on the LLM's 2-D [tokens, dim]
activations; ORT's skip-norm fusion looks for 3-D ones.) Claimed only with a weight shaped like the normalised axes
(ORT's `scale` input is required and not broadcast); otherwise the IR's decomposition runs.

cache_attention -> com.microsoft GroupQueryAttention: a layer's attention and both cache writes as one
kernel appending the new rows in place (docs/llm.md), where GroupQueryAttention computes the op exactly
(several sequences: its batch, each sequence's length in seqlens_k);
any other cache_attention is emitted as its decomposition (`lower_unfused_attention`), its cache writes
(update_slice) as Concat of slices, copies the runtime writes back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerun.backends.base import OpSupport
from edgerun.backends.onnxruntime.onnx_ops import COMPOSITES, OnnxBuilder, Translator
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node


def _rms_norm_fits(node: Node, graph: Graph) -> bool:
    x = graph.specs[node.inputs[0]].shape
    n = int(node.attrs.get("normalized_ndim", 1))
    weight = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else None
    return weight is None or graph.specs[weight].shape == x[len(x) - n:]


def _rms_norm(b: OnnxBuilder, node: Node) -> None:
    x = node.inputs[0]
    shape = b.graph.specs[x].shape
    n = int(node.attrs.get("normalized_ndim", 1))
    weight = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else \
        b.const(np.ones(shape[len(shape) - n:], np.float32), "rms_scale")
    b.node("SimplifiedLayerNormalization", [x, weight], list(node.outputs), axis=len(shape) - n,
           epsilon=float(node.attrs.get("eps", 1e-6)))


# ---- a cache write at a run-time position -----------------------------------------------------------------

def _update_slice(b: OnnxBuilder, node: Node) -> None:
    """update_slice(x, rows, start) as Concat(x before s, rows, x after s + n), s = start clamped so the rows
    fit (the IR's rule). A copy of x: only GroupQueryAttention below writes a KV cache's new rows in place. Emitted for an unfused
    cache_attention's writes; ORT does not claim update_slice on its own (the reference writes the rows in place)."""
    x, rows, start = node.inputs
    shape = b.graph.specs[x].shape
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    n = b.graph.specs[rows].shape[axis]
    first = _clamped_start(b, start, shape[axis] - n)
    axes = b.ints([axis], "axis")
    before = b.node("Slice", [x, b.ints([0], "zero"), first, axes])
    after = b.node("Slice", [x, b.node("Add", [first, b.ints([n], "rows")]), b.ints([shape[axis]], "end"), axes])
    b.node("Concat", [before, rows, after], list(node.outputs), axis=axis)


def _clamped_start(b: OnnxBuilder, start: str, highest: int, count: int = 1) -> str:
    """`start` (int32/int64, `count` elements) as an int64 [count] clamped to [0, highest]."""
    flat = b.node("Cast", [b.node("Reshape", [start, b.ints([count], "starts_shape")])], to=7)
    return b.node("Min", [b.node("Max", [flat, b.ints([0], "zero")]), b.ints([highest], "highest")])


# ---- a layer's attention and cache writes as GroupQueryAttention ------------------------------------------

GQA_HEAD_MULTIPLE = 16  # ORT's GroupQueryAttention with rotary needs head_dim % 16 == 0


def lower_unfused_attention(graph: Graph) -> Graph:
    """`graph` with each cache_attention GroupQueryAttention cannot compute exactly replaced by its
    decomposition (every other composite of the partition kept for its ORT kernel)."""
    from edgerun.ir.decompose import decomposed

    return decomposed(graph, lambda node, g: (node.op in COMPOSITES or node.op in LLM_COMPOSITES) and (
        node.op != "cache_attention" or _rope_tables(node, g) is not None))


def _rope_tables(node: Node, graph: Graph) -> tuple[np.ndarray, np.ndarray] | None:
    """GroupQueryAttention's cos and sin caches [positions, head_dim / 2] for cache_attention `node` when it
    computes the node exactly, else None. It needs: the "heads" layout, head_dim a multiple of 16, full rotary
    from constant rotate-half tables (both halves equal) covering the cache, the caches as partition
    inputs updated into partition outputs (it appends in place: CompiledPartition.overwrites_inputs), and with
    several sequences one row each (ORT refuses a batch of several rows per sequence after a past)."""
    k_cache, v_cache = node.inputs[3:5]
    hd = int(node.attrs["head_dim"])
    tables = [t for t in node.inputs[6:8] if t]
    sequences = graph.specs[k_cache].shape[0]
    if node.attrs.get("layout", "heads") != "heads" or hd % GQA_HEAD_MULTIPLE or len(tables) != 2 \
            or (sequences > 1 and graph.specs[node.inputs[0]].shape[0] != sequences) \
            or any(t not in graph.constants for t in tables) or graph.specs[tables[0]].shape[1] != hd \
            or graph.specs[tables[0]].shape[0] < graph.specs[k_cache].shape[2] \
            or k_cache not in graph.inputs or v_cache not in graph.inputs \
            or any(o not in graph.outputs for o in node.outputs[1:]):
        return None
    halves = []
    for name in tables:
        table = np.asarray(graph.constants[name], np.float32)
        if not np.array_equal(table[:, :hd // 2], table[:, hd // 2:]):
            return None
        halves.append(np.ascontiguousarray(table[:, :hd // 2]))
    return halves[0], halves[1]


def _cache_attention(b: OnnxBuilder, node: Node) -> None:
    """cache_attention as GroupQueryAttention with seqlens_k = start + T - 1 and past_key = present_key: the
    runtime binds both to the state's buffer (b.overwrites, declared by the partition). `start` is clamped to
    C - T as update_slice clamps it; the op's rotary positions then differ, but the LLM's step runner never
    asks for a chunk past the end of the context (step_runner.py). lower_unfused_attention has replaced
    every cache_attention this cannot run."""
    g = b.graph
    tables = _rope_tables(node, g)
    assert tables is not None, "lower_unfused_attention lowers the cache attentions GroupQueryAttention cannot run"
    q, k, v, k_cache, v_cache, start = node.inputs[:6]
    hd = int(node.attrs["head_dim"])
    sequences, kv, cells, _ = g.specs[k_cache].shape
    rows, width = g.specs[q].shape
    steps = rows // sequences  # rows per sequence
    seqlens, total = _once(b, f"lengths {start} {cells} {steps} {sequences}",
                           lambda: _lengths(b, start, cells, steps, sequences))
    cos = _once(b, f"cos {node.inputs[6]} {cells}", lambda: b.const(tables[0][:cells], "rope_cos"))
    sin = _once(b, f"sin {node.inputs[7]} {cells}", lambda: b.const(tables[1][:cells], "rope_sin"))
    packed = _packed_qkv(g, b.producers, q, k, v)
    if packed is not None:  # query, key and value side by side in one tensor: GroupQueryAttention's packed form
        batch = [b.node("Reshape", [packed, b.ints([sequences, steps, g.specs[packed].shape[1]], "bsd")]), "", ""]
    else:
        batch = [b.node("Reshape", [x, b.ints([sequences, steps, g.specs[x].shape[1]], "bsd")]) for x in (q, k, v)]
    scale = node.attrs.get("scale")
    options: dict[str, Any] = {}
    if node.attrs.get("window"):  # ORT's window counts the query itself: the last `window` positions
        options["local_window_size"] = int(node.attrs["window"])
    if node.attrs.get("softcap"):
        options["softcap"] = float(node.attrs["softcap"])
    attended = b.node("GroupQueryAttention", [*batch, k_cache, v_cache, seqlens, total, cos, sin],
                      [b.fresh("gqa"), node.outputs[1], node.outputs[2]], domain="com.microsoft",
                      num_heads=width // hd, kv_num_heads=kv, do_rotary=1, rotary_interleaved=0,
                      scale=float(1.0 / np.sqrt(hd) if scale is None else scale), **options)
    b.node("Reshape", [attended, b.ints([rows, width], "out_shape")], [node.outputs[0]])
    b.overwrites[node.outputs[1]], b.overwrites[node.outputs[2]] = k_cache, v_cache


def _once(b: OnnxBuilder, key: str, make: Any) -> Any:
    """What `make` returns, made once per ONNX graph (the lengths and tables every layer reads)."""
    if key not in b.shared:
        b.shared[key] = make()
    return b.shared[key]


def _lengths(b: OnnxBuilder, start: str, cells: int, rows: int, sequences: int = 1) -> tuple[str, str]:
    """GroupQueryAttention's seqlens_k (int32 [B]: each sequence's start + T - 1) and total_sequence_length
    (int32 scalar: the longest sequence's start + T)."""
    total = b.node("Add", [_clamped_start(b, start, cells - rows, sequences), b.ints([rows], "rows")])
    seqlens = b.node("Cast", [b.node("Sub", [total, b.ints([1], "one")])], to=6)
    longest = b.node("ReduceMax", [total], keepdims=0)
    scalar = b.node("Cast", [longest], to=6)
    return seqlens, scalar


def _packed_qkv(graph: Graph, producers: dict[str, Node], q: str, k: str, v: str) -> str | None:
    """The tensor [T, q | k | v] that q, k and v are consecutive column slices of (the stacked projection,
    no bias between), or None. Slices reach here as rasters: checked by running the raster on indices."""
    found = [_column_slice(graph, producers, x) for x in (q, k, v)]
    if any(f is None for f in found) or len({f[0] for f in found if f}) != 1:
        return None
    source = found[0][0] if found[0] else ""
    widths = [graph.specs[x].shape[1] for x in (q, k, v)]
    if [f[1] for f in found if f] != [0, widths[0], widths[0] + widths[1]] \
            or graph.specs[source].shape[1] != sum(widths):
        return None
    return source


def _column_slice(graph: Graph, producers: dict[str, Node], value: str) -> tuple[str, int] | None:
    """(source, first column) when `value` [T, w] is columns first..first+w of a [T, W] tensor made in `graph`."""
    node = producers.get(value)
    inputs = [i for i in node.inputs if i] if node is not None else []
    if node is None or node.op != "raster" or len(inputs) != 1 or node.attrs.get("fill") is not None:
        return None
    (source,) = inputs
    rows, width = graph.specs[value].shape
    src_shape = graph.specs[source].shape
    if len(src_shape) != 2 or src_shape[0] != rows or source in graph.inputs:
        return None
    from edgerun.oracle.kernels import KERNELS

    index = np.arange(rows * src_shape[1], dtype=np.float64).reshape(src_shape)
    out = np.full((rows, width), -1.0)
    KERNELS["raster"]([index], node.attrs, [out])
    first = int(out[0, 0]) if out.size else 0
    return (source, first) if np.array_equal(out, index[:, first:first + width]) else None


# ---- what this module declares to the backend ----------------------------------------------------------------

# The decoder's ops: their translators, and the composites among them ORT runs as one kernel. The backend
# joins these tables with onnx_ops' and onnx_quant_ops' (OnnxRuntimeBackend.composites, onnx_control_flow's
# TRANSLATORS_ALL); importing this module changes no other module's table.
LLM_TRANSLATORS: dict[str, Translator] = {"rms_norm": _rms_norm, "update_slice": _update_slice,
                                          "cache_attention": _cache_attention}
LLM_COMPOSITES = {"rms_norm": OpSupport(dtypes=frozenset({DType.float32}), check=_rms_norm_fits),
                  "cache_attention": OpSupport(dtypes=frozenset({DType.float32, DType.int32, DType.int64}))}
