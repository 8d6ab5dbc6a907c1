"""Transformer decoders on ONNX Runtime: composites as its fused kernels (one node where the IR's
decomposition would make several), and the LLM step's cache attention over the used cells only.

rms_norm -> SimplifiedLayerNormalization (ORT's RMSNorm, registered in the default ONNX domain): one kernel
instead of the six nodes of its decomposition (Mul, ReduceMean, Add, Sqrt, Reciprocal, Mul, then the
weight's Mul). A decoder layer has two, so a 30-layer LLM step loses about 300 nodes. (The ORT profile shows the
residual Add before one not fused into SkipSimplifiedLayerNormalization on the LLM's 2-D [tokens, dim]
activations; ORT's skip-norm fusion looks for 3-D ones.) Claimed only with a weight shaped like the normalised axes
(ORT's `scale` input is required and not broadcast); otherwise the IR's decomposition runs.

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
