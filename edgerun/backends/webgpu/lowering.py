"""A partition becomes a list of dispatches; with fusion, elementwise chains ride along in one dispatch.

Fusion is the backend's own pass over the partition: a node with a per-output-element kernel (elementwise,
matmul, conv, pooling, reduction, gather) anchors a dispatch, and each following elementwise node that
reads the dispatch's current value, has the same output shape, and is that value's only reader (and the
value is not a partition output) joins it as epilogue code. So matmul + bias + activation, conv + bias +
ReLU, and elementwise chains (GELU's seven ops, softmax's sub+exp) each become one dispatch, and the
intermediates never touch memory.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from edgerun.backends.webgpu.inline import InlineWriter, inline_values, replace_inline_loads
from edgerun.backends.webgpu.wgsl import (
    ELEMENTWISE,
    STORAGE_TYPE,
    Kernel,
    broadcast_strides,
    coords,
    elementwise_expr,
    is_wide_arg,
    node_body,
    offset_expr,
    raster_kernels,
    shader_source,
    wide_arg_kernel,
)
from edgerun.ir.graph import Graph, Node


@dataclass
class Group:
    anchor: Node
    chain: list[Node] = field(default_factory=list)
    siblings: list[Node] = field(default_factory=list)  # matmuls of the anchor's input, computed alongside

    @property
    def values(self) -> set[str]:
        return {self.anchor.outputs[0], *(n.outputs[0] for n in (*self.siblings, *self.chain))}


MATMULS = ("matmul", "matmul_int4")


def _sibling(node: Node, group: Group, graph: Graph) -> bool:
    """A matmul over the anchor matmul's input with constant weights and the same output shape (a decoder's
    up projection beside its gate): one thread computes both dot products, so gate + up + SiLU + mul is one
    dispatch."""
    a = group.anchor
    return (node.op == a.op and node.op in MATMULS and node.inputs[0] == a.inputs[0] and node.attrs == a.attrs
            and all(v in graph.constants for v in node.inputs[1:] if v)
            and graph.specs[node.outputs[0]].shape == graph.specs[a.outputs[0]].shape)


def identity_rasters(graph: Graph) -> dict[str, str]:
    """Rasters that copy a whole value unchanged (a reshape, or a transpose of a size-1 axis as in a decoder's
    [1, heads, hd] -> [heads, 1, hd]): output -> source. They cost no dispatch; the output shares the
    source's device range. Constant sources keep their copy (their range is in the constant buffer)."""
    alias: dict[str, str] = {}
    for node in graph.nodes:
        if node.op != "raster" or node.attrs.get("fill") is not None or len(node.attrs["regions"]) != 1:
            continue
        src, out = node.inputs[0], node.outputs[0]
        numel = graph.specs[out].numel
        if src in graph.constants or graph.specs[src].numel != numel:
            continue
        r = [int(v) for v in node.attrs["regions"][0]]
        if r[0] != 0 or r[9] * r[10] * r[11] != numel:
            continue
        i0, i1, i2 = np.meshgrid(np.arange(r[9]), np.arange(r[10]), np.arange(r[11]), indexing="ij")
        flat = np.arange(numel)
        if np.array_equal((r[1] + i0 * r[2] + i1 * r[3] + i2 * r[4]).reshape(-1), flat) and \
                np.array_equal((r[5] + i0 * r[6] + i1 * r[7] + i2 * r[8]).reshape(-1), flat):
            alias[out] = alias.get(src, src)
    return alias


def lower(graph: Graph, fuse: bool = True) -> list[Kernel]:
    """The dispatch list of `graph` (a partition with atomic ops and rasters only), in execution order. With
    fusion, identity rasters take no dispatch (`identity_rasters`): kernels bind their sources instead."""
    alias = identity_rasters(graph) if fuse else {}
    readers: Counter[str] = Counter(alias.get(v, v) for n in graph.nodes for v in n.inputs if v)
    outputs = {alias.get(v, v) for v in graph.outputs}
    inline = inline_values(graph, alias, outputs) if fuse else {}
    kernels: list[Kernel] = []
    open_group: Group | None = None
    groups: list[Group | Node] = []
    for node in graph.nodes:
        if node.outputs[0] in alias or node.outputs[0] in inline:
            continue
        if open_group is not None and fuse and _joins(node, open_group, graph, inline):
            open_group.chain.append(node)
            continue
        if open_group is not None and fuse and _sibling(node, open_group, graph):
            open_group.siblings.append(node)
            continue
        if node.op == "raster" or is_wide_arg(node, graph):
            groups.append(node)
            open_group = None
            continue
        open_group = Group(node)
        groups.append(open_group)
    for g in groups:
        if isinstance(g, Node):
            for k in [wide_arg_kernel(g, graph)] if g.op != "raster" else raster_kernels(g, graph):
                k.values = [alias.get(v, v) for v in k.values]
                kernels.append(k)
        else:
            kernels.append(group_kernel(g, graph, readers, outputs, alias, inline))
    return kernels


def _joins(node: Node, group: Group, graph: Graph, inline: dict[str, Node]) -> bool:
    """An elementwise node reading one of the group's values (or an inline raster), over the group's output
    shape. Groups are contiguous in the topological order, so every reader outside a group runs after its
    dispatch; an inline value must not read the group's own values from memory (they are stored by this
    very dispatch)."""
    shape = graph.specs[group.anchor.outputs[0]].shape
    if node.op not in ELEMENTWISE or graph.specs[node.outputs[0]].shape != shape:
        return False
    reads_inline = [v for v in node.inputs if v in inline]
    if reads_inline and _memory_inputs(reads_inline, inline) & group.values:
        return False
    return any(v in group.values for v in node.inputs) or bool(reads_inline)


def _memory_inputs(values: list[str], inline: dict[str, Node]) -> set[str]:
    found: set[str] = set()
    todo = list(values)
    while todo:
        v = todo.pop()
        if v in inline:
            todo += [u for u in inline[v].inputs if u]
        else:
            found.add(v)
    return found


def group_kernel(group: Group, graph: Graph, readers: Counter[str], outputs: set[str],
                 alias: dict[str, str], inline: dict[str, Node]) -> Kernel:
    """One dispatch for the group; it stores each value read outside the group (or a partition output).
    Shapes come from the values the nodes name; bindings go to their identity-raster sources (`alias`)."""
    body = node_body(group.anchor, graph)
    bound = list(body.inputs)
    lines = list(body.lines)
    anchor_out = group.anchor.outputs[0]
    shape = graph.specs[anchor_out].shape
    current = {anchor_out: "acc"}
    inside: Counter[str] = Counter()
    for j, sib in enumerate(group.siblings):  # in a block of its own: its lets shadow the anchor's
        extra = node_body(sib, graph)
        first = len(bound)
        bound += extra.inputs
        shifted = [_shift_loads(line, first) for line in extra.lines]
        lines += [f"var sib{j}: f32;", "{", *shifted, f"sib{j} = acc;", "}"]
        current[sib.outputs[0]] = f"sib{j}"
    if group.chain:
        lines += coords(shape, prefix="e")
    for k, node in enumerate(group.chain):
        args = []
        for v in node.inputs:
            if v in current:
                inside[v] += 1
                args.append(current[v])
                continue
            bound.append(v)
            strides = broadcast_strides(graph.specs[v].shape, shape)
            args.append(f"in{len(bound) - 1}[{offset_expr(strides, prefix='e')}]")
        name = f"acc_e{k}"
        lines.append(f"let {name} = {elementwise_expr(node, graph, args)};")
        current[node.outputs[0]] = name
    helpers = ""
    if any(v in inline for v in bound):
        def load(v: str) -> int:
            bound.append(v)
            return len(bound) - 1
        writer = InlineWriter(graph, inline, load)
        lines = replace_inline_loads(lines, list(bound), writer)
        helpers = "".join(writer.functions.values())
    bound, (lines, helpers) = _bind_once([alias.get(v, v) for v in bound], lines, helpers)
    stored = [v for v in current if v in outputs or readers[v] > inside[v]]
    lines += [f"out{j}[idx] = {current[v]};" for j, v in enumerate(stored)]
    status = group.anchor.op == "gather"
    source = shader_source([STORAGE_TYPE[graph.specs[v].dtype] for v in bound], lines,
                           [STORAGE_TYPE[graph.specs[v].dtype] for v in stored], math.prod(shape), status=status,
                           helpers=helpers)
    nodes = [group.anchor.name, *(n.name for n in (*group.siblings, *group.chain))]
    label = "+".join(["|".join(n.op for n in (group.anchor, *group.siblings)), *(n.op for n in group.chain)])
    return Kernel(source, [*bound, *stored], math.prod(shape), nodes, label=label, status=status,
                  n_outputs=len(stored))


_LOAD = re.compile(r"\bin(\d+)\[")


def _shift_loads(line: str, by: int) -> str:
    return _LOAD.sub(lambda m: f"in{by + int(m.group(1))}[", line)


def _bind_once(bound: list[str], lines: list[str], helpers: str = "") -> tuple[list[str], tuple[list[str], str]]:
    """Bind each value the code reads once (x * x reads one binding; an inline value's placeholder is not
    read at all): fewer bindings, and no two writable bindings of one range, which browsers' WebGPU refuses
    as aliasing."""
    used = sorted({int(m.group(1)) for text in (*lines, helpers) for m in _LOAD.finditer(text)})
    unique: list[str] = []
    slot: dict[int, int] = {}
    for j in used:
        if bound[j] not in unique:
            unique.append(bound[j])
        slot[j] = unique.index(bound[j])
    if unique == bound:
        return bound, (lines, helpers)

    def sub(text: str) -> str:
        return _LOAD.sub(lambda m: f"in{slot[int(m.group(1))]}[", text)
    return unique, ([sub(line) for line in lines], sub(helpers))
