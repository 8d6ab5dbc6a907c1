"""A training step's stride-1 conv2d computed as one matrix product over the im2col windows its weight
cotangent lays out anyway.

conv2d's weight cotangent (ir/ops/window_gradients.py) lays the conv's input out as col [(ci, tap), (ho, wo,
n)] in backward. The forward convolution is the weight as [co, (ci, tap)] times those same windows, so the step
can compute col once, in forward, and convolve by one GEMM: on ONNX Runtime a convolution whose weight is an
input (a trained weight is state, not a constant) takes its generic path, not the blocked one it packs constant
weights for: for a digits CNN's [32, 32, 4, 4] -> [32, 64, 4, 4] layer at one thread, 310 us with the weight
an input, 149 us with it constant, 190 us for the GEMM. The training build runs this right after the backward
graph is appended, before it chooses what to keep: col (kh*kw times the input's bytes) is then a forward
activation like any other, kept for backward or, under an activation budget, computed again there
(passes/autodiff.py).
"""

from __future__ import annotations

from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph, Node
from edgerun.ir.ops.window_gradients import WINDOWS_OF
from edgerun.ir.region import Region

# A conv whose windows have fewer rows (ci * kh * kw) stays a convolution: a first layer's 1 x 3 x 3 product
# is memory-bound, and the output's layout change costs what it saves (the digits CNN's first layer on ONNX
# Runtime: 48 us as a Conv, 24 + 17 + the transpose as a MatMul, bias Add and Transpose).
MIN_WINDOW_ROWS = 32
# Windows kept from forward to backward hold kh*kw times their input's elements; above this many (1 MB in
# float32) a conv stays a convolution and its windows are laid out in backward only, one layer's at a time.
MAX_KEPT_WINDOW_ELEMENTS = 1 << 18


def convolve_over_windows(graph: Graph) -> int:
    """Rewrite each conv2d whose input's im2col windows backward builds (node meta WINDOWS_OF) as a matmul
    over them, the windows moved ahead of it; returns how many were rewritten."""
    rewritten = 0
    for col_node in [n for n in graph.nodes if WINDOWS_OF in n.meta]:
        producers = graph.producers()
        conv = producers.get(col_node.meta[WINDOWS_OF])
        layout = producers.get(col_node.inputs[0])
        # The windows must read the conv's own input: after recompute, backward may read a copy made later.
        if conv is None or conv.op != "conv2d" or layout is None or layout.inputs != [conv.inputs[0]]:
            continue
        windows = graph.specs[col_node.outputs[0]]
        if windows.shape[0] < MIN_WINDOW_ROWS or windows.numel > MAX_KEPT_WINDOW_ELEMENTS:
            continue
        _rewrite(graph, conv, layout, col_node)
        rewritten += 1
    return rewritten


def _rewrite(graph: Graph, conv: Node, layout: Node, col_node: Node) -> None:
    b = Builder(graph, meta={k: v for k, v in conv.meta.items() if k != "gradient_of"})
    col = col_node.outputs[0]
    w = conv.inputs[1]
    n, co, ho, wo = graph.specs[conv.outputs[0]].shape
    plane = ho * wo
    first_new = len(graph.nodes)
    w2 = b.emit("reshape", [w], shape=[co, graph.specs[col].shape[0]])
    ym = b.emit("matmul", [w2, col])  # [co, (ho, wo, n)]
    if len(conv.inputs) > 2 and conv.inputs[2]:  # added before the layout change: one Gemm on ONNX Runtime
        ym = b.binary("add", ym, b.emit("reshape", [conv.inputs[2]], shape=[co, 1]))
    y = b.emit("raster", [ym], shape=[n, co, ho, wo], fill=None,
               regions=[Region(0, 0, (1, plane * n, n), 0, (co * plane, plane, 1), (n, co, plane)).to_list()])
    new = graph.nodes[first_new:]
    del graph.nodes[first_new:]
    # The last new node writes the conv's output name, so every reader (backward's included) is unchanged.
    del graph.specs[y]
    new[-1].outputs = [conv.outputs[0]]
    new[-1].name = conv.name
    for node in (layout, col_node):
        node.meta = {k: v for k, v in node.meta.items() if k not in ("gradient_of", WINDOWS_OF)}
    moved = {id(layout), id(col_node)}
    nodes = [node for node in graph.nodes if id(node) not in moved]
    at = next(i for i, node in enumerate(nodes) if node is conv)
    graph.nodes = [*nodes[:at], layout, col_node, *new, *nodes[at + 1:]]
