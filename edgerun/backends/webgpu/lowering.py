"""A partition becomes a list of dispatches; with fusion, elementwise chains ride along in one dispatch.

Fusion is the backend's own pass over the partition: a node with a per-output-element kernel (elementwise,
matmul, conv, pooling, reduction, gather) anchors a dispatch, and each following elementwise node that
reads the dispatch's current value, has the same output shape, and is that value's only reader (and the
value is not a partition output) joins it as epilogue code. So matmul + bias + activation, conv + bias +
ReLU, and elementwise chains (GELU's seven ops, softmax's sub+exp) each become one dispatch, and the
intermediates never touch memory.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from edgerun.backends.webgpu.wgsl import (ELEMENTWISE, WGSL_TYPE, Kernel, _shader, broadcast_strides, coords,
                                          elementwise_expr, node_body, offset_expr, raster_kernels)
from edgerun.ir.graph import Graph, Node


@dataclass
class Group:
    anchor: Node
    chain: list[Node] = field(default_factory=list)

    @property
    def last(self) -> Node:
        return self.chain[-1] if self.chain else self.anchor


def lower(graph: Graph, fuse: bool = True) -> list[Kernel]:
    """The dispatch list of `graph` (a partition with atomic ops and rasters only), in execution order."""
    readers: Counter[str] = Counter(v for n in graph.nodes for v in n.inputs if v)
    outputs = set(graph.outputs)
    kernels: list[Kernel] = []
    open_group: Group | None = None
    groups: list[Group | Node] = []
    for node in graph.nodes:
        if open_group is not None and fuse and _joins(node, open_group, graph, readers, outputs):
            open_group.chain.append(node)
            continue
        if node.op == "raster":
            groups.append(node)
            open_group = None
            continue
        open_group = Group(node)
        groups.append(open_group)
    for g in groups:
        if isinstance(g, Node):
            kernels += raster_kernels(g, graph)
        else:
            kernels.append(group_kernel(g, graph))
    return kernels


def _joins(node: Node, group: Group, graph: Graph, readers: Counter[str], outputs: set[str]) -> bool:
    value = group.last.outputs[0]
    return (node.op in ELEMENTWISE and value in node.inputs and readers[value] == 1 and value not in outputs
            and graph.specs[node.outputs[0]].shape == graph.specs[value].shape)


def group_kernel(group: Group, graph: Graph) -> Kernel:
    body = node_body(group.anchor, graph)
    bound = list(body.inputs)
    lines = list(body.lines)
    out_name = group.last.outputs[0]
    out = graph.specs[out_name]
    current = {group.anchor.outputs[0]: "acc"}
    if group.chain:
        lines += coords(out.shape, prefix="e")
    for k, node in enumerate(group.chain):
        args = []
        for v in node.inputs:
            if v in current:
                args.append(current[v])
                continue
            bound.append(v)
            strides = broadcast_strides(graph.specs[v].shape, out.shape)
            args.append(f"in{len(bound) - 1}[{offset_expr(strides, prefix='e')}]")
        name = f"acc_e{k}"
        lines.append(f"let {name} = {elementwise_expr(node, graph, args)};")
        current[node.outputs[0]] = name
    if group.chain:
        lines.append(f"let acc_out = {current[out_name]};")
        lines.append("out[idx] = acc_out;")
    status = group.anchor.op == "gather"
    source = _shader([WGSL_TYPE[graph.specs[v].dtype] for v in bound], lines, WGSL_TYPE[out.dtype], out.numel,
                     status=status, store=not group.chain)
    nodes = [group.anchor.name, *(n.name for n in group.chain)]
    label = "+".join([group.anchor.op, *(n.op for n in group.chain)])
    return Kernel(source, [*bound, out_name], out.numel, nodes, label=label, status=status)
