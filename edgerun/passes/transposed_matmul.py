"""A transposed matrix product as the product of the transposes: (A @ B)^T = B^T @ A^T.

A weight's gradient in a backward graph comes out transposed: the forward reads a linear layer's weight
[out, in] through a transpose (x @ W^T), so the matmul rule gives the gradient of W^T, x^T @ g, and the
transpose's own rule turns that [in, out] product back into [out, in]. Written as g^T @ x instead, the
product lands in the weight's layout and the only transpose left is of the small cotangent g ([batch, out]),
which a backend reads as a transposed operand (ONNX Runtime's Gemm transA) rather than copying; x^T and the
[in, out] product's transpose (784x256 for an MLP's first layer) disappear, the transpose of a transpose
merging into the value itself (RasterMergePass).
"""

from __future__ import annotations

import numpy as np

from edgerun.ir.builder import Builder
from edgerun.ir.graph import Graph, Node
from edgerun.ir.region import Region, regions_of

# Index maps are compared element by element up to this size.
MAX_CHECKED = 1 << 22


def transpose_source(graph: Graph, node: Node) -> str | None:
    """The source of `node` when it is a raster writing its one [q, p] source (of any shape holding p*q
    elements, read row-major as [q, p]) transposed into a [p, q] output; else None."""
    if node.op != "raster" or node.attrs.get("fill") is not None or len(node.inputs) != 1:
        return None
    shape = graph.specs[node.outputs[0]].shape
    regions = regions_of(node.attrs)
    if len(shape) != 2 or len(regions) != 1 or regions[0].src != 0:
        return None
    p, q = shape
    if regions[0].numel != p * q or graph.specs[node.inputs[0]].numel != p * q or p * q > MAX_CHECKED:
        return None
    dst, src = regions[0].index_grids()
    return node.inputs[0] if np.array_equal(src, (dst % q) * p + dst // q) else None


def _transpose(b: Builder, value: str) -> str:
    rows, cols = b.shape(value)
    return b.emit("raster", [value], shape=[cols, rows], fill=None,
                  regions=[Region(0, 0, (0, 1, cols), 0, (0, rows, 1), (1, cols, rows)).to_list()])


def swap_transposed_products(graph: Graph) -> int:
    """Rewrite each raster transposing the 2-D product of a matmul that nothing else reads into the product
    of the transposed operands, keeping the raster's output name; returns how many. Run RasterMergePass
    after it: it drops the products left unread, and the new transposes of values that are themselves
    transposes cancel there."""
    producers = graph.producers()
    consumers = graph.consumers()
    count = 0
    nodes = list(graph.nodes)
    graph.nodes = []
    b = Builder(graph)
    for node in nodes:
        product = producers.get(node.inputs[0]) if node.op == "raster" and node.inputs else None
        if (product is None or product.op != "matmul" or len(consumers.get(product.outputs[0], [])) != 1
                or transpose_source(graph, node) is None
                or any(graph.specs[i].rank != 2 for i in product.inputs)):
            graph.nodes.append(node)
            continue
        b.meta = dict(node.meta)
        a, c = product.inputs
        made = b.emit("matmul", [_transpose(b, c), _transpose(b, a)])
        graph.nodes[-1].outputs = [node.outputs[0]]
        del graph.specs[made]
        count += 1
    return count
