"""A KV-cache append in place: `update_slice` writes only its rows into its input's device range.

A decoder's step writes each layer's new key and value rows into the cache at the run-time position
(`update_slice(cache, rows, start)`). Out of place that is a copy of the whole cache per layer; in place the
output shares the cache's device range (like an identity raster's) and the dispatch has one thread per new
element, writing it at `start`. It is sound when nothing reads the cache after the update (every reader
runs earlier, checked in graph order, through identity-raster aliases) and nothing in the partition reads
its output (a state update, written back after the call). Such an append floats: the lowering puts it in
the first dispatch after the last one it must follow (the cache's last reader, the producers of its rows
and start), beside whatever runs there (horizontal fusion: it binds no buffer of its own), so an append
costs no dispatch wherever a program emits it. The LLM step's appends are inside `cache_attention`,
which the backend claims whole (attention.py): its updated caches share their inputs' ranges by the same
rule, and its kernel writes the rows.
"""

from __future__ import annotations

import math

from edgerun.backends.webgpu.wgsl import STORAGE_TYPE, coords, row_major
from edgerun.ir.graph import Graph, Node


def in_place_updates(graph: Graph, alias: dict[str, str]) -> dict[str, str]:
    """Updated value -> the device value it writes into (its input's alias root), for each update_slice
    output and each cache_attention's updated caches (attention.py) whose input is not a constant, not a
    partition output, and not read by any node after it, and which no node reads."""
    outputs = {alias.get(v, v) for v in graph.outputs}
    last_read: dict[str, int] = {}
    for k, node in enumerate(graph.nodes):
        for v in node.inputs:
            if v:
                last_read[alias.get(v, v)] = k
    found: dict[str, str] = {}
    for k, node in enumerate(graph.nodes):
        if node.op == "update_slice":
            pairs, others = [(node.inputs[0], node.outputs[0])], node.inputs[1:]
        elif node.op == "cache_attention":
            pairs, others = list(zip(node.inputs[3:5], node.outputs[1:3])), [*node.inputs[:3], *node.inputs[5:]]
        else:
            continue
        for source, updated in pairs:
            root = alias.get(source, source)
            if root in graph.constants or root in outputs or last_read[root] != k or updated in last_read:
                continue
            if any(alias.get(v, v) == root for v in others if v):  # rows read from the cache itself
                continue
            found[updated] = root
    return found


def update_lines(node: Node, graph: Graph) -> tuple[list[str], int]:
    """The kernel lines (in0 = rows, in1 = start, out0 = the cache) and thread count: one thread per row
    element, stored at its place in the cache (start clamped so the rows fit, as the reference does)."""
    x, rows = graph.specs[node.inputs[0]], graph.specs[node.inputs[1]]
    axis = int(node.attrs.get("axis", 0)) % x.rank
    n = rows.shape[axis]
    strides = row_major(x.shape)
    at = " + ".join([f"c{a} * {s}" for a, s in enumerate(strides) if a != axis] + [f"(c{axis} + first) * {strides[axis]}"])
    lines = [*coords(rows.shape), f"let first = clamp(i32(in1[0]), 0, {x.shape[axis] - n});",
             f"out0[{at}] = in0[idx];"]
    return lines, math.prod(rows.shape)


def storage_types(node: Node, graph: Graph) -> tuple[list[str], list[str]]:
    rows, start, x = (graph.specs[v] for v in (node.inputs[1], node.inputs[2], node.inputs[0]))
    return [STORAGE_TYPE[rows.dtype], STORAGE_TYPE[start.dtype]], [STORAGE_TYPE[x.dtype]]
