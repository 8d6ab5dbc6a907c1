"""Transformer decoders on ONNX Runtime: composites as its fused kernels (one node where the IR's
decomposition would make several), and the LLM step's cache attention over the used cells only.

rms_norm -> SimplifiedLayerNormalization (ORT's RMSNorm, registered in the default ONNX domain): one kernel
instead of the six nodes of its decomposition (Mul, ReduceMean, Add, Sqrt, Reciprocal, Mul, then the
weight's Mul). A decoder layer has two, so a 30-layer LLM step loses about 300 nodes. (The ORT profile shows the
residual Add before one not fused into SkipSimplifiedLayerNormalization on the LLM's 2-D [tokens, dim]
activations; ORT's skip-norm fusion looks for 3-D ones.) Claimed only with a weight shaped like the normalised axes
(ORT's `scale` input is required and not broadcast); otherwise the IR's decomposition runs.

update_slice -> Concat of slices (a copy); within a fused attention, GroupQueryAttention's in-place append.

CacheAttentionFusion: each layer's attention and cache writes as one GroupQueryAttention (docs/llm.md).

attend_used_cells: the static-shape attention over a whole KV cache, as the LLM step builder tags it, sliced
to the run-time number of cells in use (docs/llm.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerun.backends.base import OpSupport
from edgerun.backends.onnxruntime.onnx_ops import COMPOSITES, TRANSLATORS, OnnxBuilder
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


TRANSLATORS["rms_norm"] = _rms_norm
COMPOSITES["rms_norm"] = OpSupport(dtypes=frozenset({DType.float32}), check=_rms_norm_fits)


# ---- attention over the used cache cells ------------------------------------------------------------------

def attend_used_cells(model: Any, graph: Graph) -> int:
    """Rewrite, in place, the cache attention of an LLM step so it reads only the cache cells in use.

    The step graph (edgerun/llm/program_builder.py) attends over the whole cache with static shapes:
    `s = where(keep, q @ k_cache, -inf)`, a softmax over `[s | chunk scores]`, then `p[..., :C] @ v_cache`.
    Where `keep` is false from cell L on (L = 1 + its last true index, computed per run), `q @ k_cache[..., :L]`
    padded back to C columns gives the same `where`, and the probabilities of cells >= L are exactly 0, so
    `p[..., :L] @ v_cache[:, :L]` is the same product without the zero terms. ONNX Runtime runs both with the
    run-time length: a decode step at position 150 of a 512-cell cache reads 150 cells of keys and values, not
    512. Found on the IR graph by the step builder's node meta (the ONNX values keep the IR names); returns how
    many attentions were rewritten.
    """
    onnx_producer = {out: k for k, n in enumerate(model.graph.node) for out in n.output}
    rewrites = [found for found in _cache_attentions(graph)
                if all(v in onnx_producer for v in (found[0], found[2], found[3]))]
    if not rewrites:
        return 0
    from onnx import helper

    new_nodes: dict[int, list[Any]] = {}  # ONNX node index -> nodes to emit in its place
    lengths: dict[str, str] = {}
    for where, mask, k_out, v_out in rewrites:
        k_index, v_index = onnx_producer[k_out], onnx_producer[v_out]
        k_node, v_node = model.graph.node[k_index], model.graph.node[v_index]
        onnx_mask = model.graph.node[onnx_producer[where]].input[0]
        cells = graph.specs[mask].shape[-1]
        first: list[Any] = []
        if onnx_mask not in lengths:  # L = max(1 + last true index of keep, 1), as a [1] int64
            name = f"{k_out}_used"
            index = _const(model, f"{name}_index", np.arange(1, cells + 1, dtype=np.int64))
            first += [helper.make_node("Cast", [onnx_mask], [f"{name}_int"], to=7),
                      helper.make_node("Reshape", [f"{name}_int", _const(model, f"{name}_flat", np.array([-1]))],
                                       [f"{name}_flat_mask"]),
                      helper.make_node("Mul", [f"{name}_flat_mask", index], [f"{name}_last"]),
                      helper.make_node("ReduceMax", [f"{name}_last"], [f"{name}_max"], keepdims=1),
                      helper.make_node("Max", [f"{name}_max", _const(model, f"{name}_one", np.array([1]))], [name])]
            lengths[onnx_mask] = name
        used = lengths[onnx_mask]
        zero = _const(model, f"{k_out}_zero", np.array([0], np.int64))
        q, keys = k_node.input
        new_nodes.setdefault(k_index, []).extend([
            *first,
            helper.make_node("Slice", [keys, zero, used, _const(model, f"{k_out}_axis", np.array([-1]))],
                             [f"{k_out}_keys"]),
            helper.make_node("MatMul", [q, f"{k_out}_keys"], [f"{k_out}_scores"]),
            helper.make_node("Sub", [_const(model, f"{k_out}_cells", np.array([cells])), used], [f"{k_out}_pad"]),
            helper.make_node("Concat", [_const(model, f"{k_out}_pads0", np.zeros(5, np.int64)), f"{k_out}_pad"],
                             [f"{k_out}_pads"], axis=0),
            helper.make_node("Pad", [f"{k_out}_scores", f"{k_out}_pads"], [k_out]),  # masked by the where
        ])
        probs, values = v_node.input
        new_nodes.setdefault(v_index, []).extend([
            helper.make_node("Slice", [probs, zero, used, _const(model, f"{v_out}_axis", np.array([-1]))],
                             [f"{v_out}_probs"]),
            helper.make_node("Slice", [values, zero, used, _const(model, f"{v_out}_axis1", np.array([-2]))],
                             [f"{v_out}_values"]),
            helper.make_node("MatMul", [f"{v_out}_probs", f"{v_out}_values"], [v_out]),
        ])
    nodes = []
    for k, node in enumerate(model.graph.node):
        nodes.extend(new_nodes.get(k, [node]))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    entry = model.metadata_props.add()  # what compile reports in the partition's info
    entry.key, entry.value = USED_CELLS_KEY, str(len(rewrites))
    return len(rewrites)


def _const(model: Any, name: str, value: np.ndarray) -> str:
    from onnx import numpy_helper

    model.graph.initializer.append(numpy_helper.from_array(np.asarray(value, np.int64), name))
    return name


USED_CELLS_KEY = "edgerun.attentions_over_used_cells"
CACHE_ROLE = "llm_cache"  # node meta the step builder sets: "<layer> scores" / "<layer> mask" / "<layer> values"


def _cache_attentions(graph: Graph) -> list[tuple[str, str, str, str]]:
    """(where output, mask, scores matmul output, values matmul output) per layer the step builder tagged
    (program_builder.py's attention: `where(keep, q @ k_cache, -inf)`, whose probabilities' cache columns
    go into `@ v_cache`, so those of cells where keep is false are exactly 0), checked for shape."""
    roles: dict[str, dict[str, Node]] = {}
    for node in graph.nodes:
        tag = node.meta.get(CACHE_ROLE)
        if tag and " " in tag:
            layer, role = tag.split(" ", 1)
            roles.setdefault(layer, {})[role] = node
    found = []
    for parts in roles.values():
        scores, where, values = parts.get("scores"), parts.get("mask"), parts.get("values")
        if scores is None or where is None or values is None or where.op != "where" or scores.op != "matmul" \
                or values.op != "matmul" or where.inputs[1] != scores.outputs[0]:
            continue
        mask, keys, vals = where.inputs[0], scores.inputs[1], values.inputs[1]
        cells = graph.specs[mask].shape[-1]
        if graph.specs[mask].shape == (1, 1, cells) and graph.specs[keys].rank == 3 and graph.specs[vals].rank == 3 \
                and graph.specs[keys].shape[2] == cells and graph.specs[vals].shape[1] == cells \
                and graph.specs[values.inputs[0]].shape[-1] == cells:
            found.append((where.outputs[0], mask, scores.outputs[0], values.outputs[0]))
    return found


# ---- a cache write at a run-time position -----------------------------------------------------------------

ATTENTION_ROLE = "llm_attention"  # program_builder.ATTENTION_ROLE (backends do not import the LLM package)


def _update_slice(b: OnnxBuilder, node: Node) -> None:
    """update_slice(x, rows, start) as Concat(x before s, rows, x after s + n), s = start clamped so the rows
    fit (the IR's rule). A copy of x: only the fused attention below writes a KV cache's new rows in place."""
    x, rows, start = node.inputs
    shape = b.graph.specs[x].shape
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    n = b.graph.specs[rows].shape[axis]
    first = _clamped_start(b, start, shape[axis] - n)
    axes = b.ints([axis], "axis")
    before = b.node("Slice", [x, b.ints([0], "zero"), first, axes])
    after = b.node("Slice", [x, b.node("Add", [first, b.ints([n], "rows")]), b.ints([shape[axis]], "end"), axes])
    b.node("Concat", [before, rows, after], list(node.outputs), axis=axis)


def _clamped_start(b: OnnxBuilder, start: str, highest: int) -> str:
    """`start` (int32/int64, one element) as an int64 [1] clamped to [0, highest]."""
    flat = b.node("Cast", [b.node("Reshape", [start, b.ints([1], "one_shape")])], to=7)
    return b.node("Min", [b.node("Max", [flat, b.ints([0], "zero")]), b.ints([highest], "highest")])


def _is_cache_write(node: Node, graph: Graph) -> bool:
    """Claimed only as an LLM step's tagged cache write, which CacheAttentionFusion folds into its attention.
    Any other update_slice stays on the reference, whose kernel writes just the rows in place (a copy of
    the whole tensor here)."""
    return str(node.meta.get(ATTENTION_ROLE, "")).endswith(" write")


TRANSLATORS["update_slice"] = _update_slice
# Merged into the ORT backend's table only (not onnx_ops.SUPPORTED, which MNN's table is made from).
LLM_SUPPORTED = {"update_slice": OpSupport(dtypes=frozenset({DType.float32, DType.int32, DType.int64}),
                                           check=_is_cache_write)}


# ---- a layer's attention and cache writes as GroupQueryAttention ------------------------------------------

FUSED_ATTENTIONS_KEY = "edgerun.fused_attentions"
OVERWRITES_KEY = "edgerun.overwrites:"  # + output name -> the input whose buffer GroupQueryAttention appends to
GQA_HEAD_MULTIPLE = 16  # ORT's GroupQueryAttention with rotary needs head_dim % 16 == 0


class CacheAttentionFusion:
    """Each layer of an LLM step whose attention and two cache writes are all in this partition, emitted as
    one com.microsoft GroupQueryAttention (rotary embedding included) appending its new rows to the caches.

    The step builder (edgerun/llm/program_builder.py, layout "heads") tags the attention's ends in node meta
    (ATTENTION_ROLE), and each role promises what this relies on:
    - "<i> q" / "<i> k" / "<i> v": a reshape [T, heads * hd] -> [T, heads, hd] of the projection (bias added);
      q and k are rotated by the tables "rope cos" / "rope sin" gathered at positions start + t (rotate-half,
      the tables' two halves equal), q is scaled by 1 / sqrt(hd), and query heads share key/value heads in
      groups side by side;
    - "<i> out": the attention's output [T, heads * hd], causal over the cache cells before `start` and the
      chunk's own rows;
    - "<i> k write" / "<i> v write": update_slice of the cache state [1, kv_heads, C, hd] along axis 2 at
      `start` with the rotated keys / the values.
    GroupQueryAttention computes exactly that with seqlens_k = start + T - 1 and past_key = present_key: the
    runtime binds both to the state's buffer (CompiledPartition.overwrites_inputs). `start` is clamped to
    C - T as update_slice clamps it; the IR's rotary positions then differ, but the LLM's step runner never
    asks for a chunk past the end of the context (step_runner.py).
    """

    def __init__(self, graph: Graph) -> None:
        roles: dict[str, Node] = {}
        for node in graph.nodes:
            role = node.meta.get(ATTENTION_ROLE)
            if role:
                roles[role] = node
        self.graph = graph
        self.layers: dict[str, tuple[Node, Node, Node, Node, Node, Node]] = {}  # out node name -> its nodes
        self.writes: set[str] = set()
        self.overwrites: dict[str, str] = {}
        self.tables = self._rope_tables(roles.get("rope cos"), roles.get("rope sin"))
        if self.tables is None:
            return
        layers = {role.split(" ", 1)[0] for role in roles if role.endswith(" out")}
        for layer in sorted(layers):
            found = [roles.get(f"{layer} {r}") for r in ("q", "k", "v", "out", "k write", "v write")]
            parts = tuple(n for n in found if n is not None)
            if len(parts) == 6 and self._fits(*parts):
                out, k_write, v_write = parts[3:]
                self.layers[out.name] = parts  # type: ignore[assignment]
                self.writes |= {k_write.name, v_write.name}
                self.overwrites[k_write.outputs[0]] = k_write.inputs[0]
                self.overwrites[v_write.outputs[0]] = v_write.inputs[0]
        self._shared: dict[str, Any] = {}  # the lengths and tables all layers read, emitted once
        self._producers = graph.producers()

    def _rope_tables(self, cos: Node | None, sin: Node | None) -> tuple[np.ndarray, np.ndarray] | None:
        tables = []
        for node in (cos, sin):
            if node is None or node.op != "gather" or node.inputs[0] not in self.graph.constants:
                return None
            table = np.asarray(self.graph.constants[node.inputs[0]], np.float32)
            half = table.shape[-1] // 2
            if table.ndim != 2 or not np.array_equal(table[:, :half], table[:, half:]):
                return None
            tables.append(np.ascontiguousarray(table[:, :half]))
        return tables[0], tables[1]

    def _fits(self, q: Node, k: Node, v: Node, out: Node, k_write: Node, v_write: Node) -> bool:
        g = self.graph
        cache = g.specs[k_write.inputs[0]].shape
        if len(cache) != 4 or cache[0] != 1 or g.specs[v_write.inputs[0]].shape != cache:
            return False
        _, kv, cells, hd = cache
        rows = g.specs[q.inputs[0]].shape[0]
        heads = g.specs[q.inputs[0]].shape[-1] // hd
        assert self.tables is not None
        return (hd % GQA_HEAD_MULTIPLE == 0 and heads % kv == 0 and rows <= cells <= self.tables[0].shape[0]
                and all(len([i for i in n.inputs if i]) == 1 for n in (q, k, v, out))  # reshapes (or as rasters)
                and g.specs[q.inputs[0]].shape == (rows, heads * hd) and g.specs[out.outputs[0]].shape == (rows, heads * hd)
                and g.specs[k.inputs[0]].shape == g.specs[v.inputs[0]].shape == (rows, kv * hd)
                and all(w.op == "update_slice" and int(w.attrs.get("axis", 0)) % 4 == 2 and w.inputs[0] in g.inputs
                        and w.outputs[0] in g.outputs for w in (k_write, v_write))
                and k_write.inputs[2] == v_write.inputs[2] and g.specs[k_write.inputs[1]].shape == (1, kv, rows, hd)
                and g.specs[v_write.inputs[1]].shape == (1, kv, rows, hd))

    def emit(self, b: OnnxBuilder, node: Node) -> bool:
        """Emit `node`'s part of a fused attention (nothing for its cache writes); False for any other node.
        The unfused attention's nodes are emitted as usual and left dead (build_model keeps the live ones)."""
        if node.name in self.writes:
            return True
        parts = self.layers.get(node.name)
        if parts is None:
            return False
        q, k, v, out, k_write, v_write = parts
        g = self.graph
        _, kv, cells, hd = g.specs[k_write.inputs[0]].shape
        rows, width = g.specs[out.outputs[0]].shape
        lengths = self._once(f"lengths {k_write.inputs[2]} {cells} {rows}", lambda: self._lengths(b, k_write.inputs[2],
                                                                                                   cells, rows))
        seqlens, total = lengths
        assert self.tables is not None
        cos_table, sin_table = self.tables
        cos = self._once(f"cos {cells}", lambda: b.const(cos_table[:cells], "rope_cos"))
        sin = self._once(f"sin {cells}", lambda: b.const(sin_table[:cells], "rope_sin"))
        packed = self._packed_qkv(q.inputs[0], k.inputs[0], v.inputs[0])
        if packed is not None:  # query, key and value side by side in one tensor: GroupQueryAttention's packed form
            batch = [b.node("Reshape", [packed, b.ints([1, rows, g.specs[packed].shape[1]], "bsd")]), "", ""]
        else:
            batch = [b.node("Reshape", [n.inputs[0], b.ints([1, rows, g.specs[n.inputs[0]].shape[1]], "bsd")])
                     for n in (q, k, v)]
        attended = b.node("GroupQueryAttention", [*batch, k_write.inputs[0], v_write.inputs[0], seqlens, total, cos, sin],
                          [b.fresh("gqa"), k_write.outputs[0], v_write.outputs[0]], domain="com.microsoft",
                          num_heads=width // hd, kv_num_heads=kv, do_rotary=1, rotary_interleaved=0,
                          scale=float(1.0 / np.sqrt(hd)))
        b.node("Reshape", [attended, b.ints([rows, width], "out_shape")], list(out.outputs))
        return True

    def _packed_qkv(self, q: str, k: str, v: str) -> str | None:
        """The tensor [T, q | k | v] that q, k and v are consecutive column slices of (the stacked projection,
        no bias between), or None. Slices reach here as rasters: checked by running the raster on indices."""
        found = [_column_slice(self.graph, self._producers, x) for x in (q, k, v)]
        if any(f is None for f in found) or len({f[0] for f in found if f}) != 1:
            return None
        source = found[0][0] if found[0] else ""
        widths = [self.graph.specs[x].shape[1] for x in (q, k, v)]
        if [f[1] for f in found if f] != [0, widths[0], widths[0] + widths[1]] \
                or self.graph.specs[source].shape[1] != sum(widths):
            return None
        return source

    def _once(self, key: str, make: Any) -> Any:
        if key not in self._shared:
            self._shared[key] = make()
        return self._shared[key]

    @staticmethod
    def _lengths(b: OnnxBuilder, start: str, cells: int, rows: int) -> tuple[str, str]:
        """GroupQueryAttention's seqlens_k (int32 [1]: start + T - 1) and total_sequence_length (int32 scalar)."""
        total = b.node("Add", [_clamped_start(b, start, cells - rows), b.ints([rows], "rows")])
        seqlens = b.node("Cast", [b.node("Sub", [total, b.ints([1], "one")])], to=6)
        scalar = b.node("Cast", [b.node("Reshape", [total, b.ints([], "scalar")])], to=6)
        return seqlens, scalar


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
