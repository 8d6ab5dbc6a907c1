"""RMSNorm computed inside the matmuls that read it: a decoder's two norms per layer take no dispatch.

zerotvm runs a residual add + RMSNorm dispatch between projections. Here the residual add rides in the
projection's epilogue (lowering.py), and the norm moves into the next projections' prologue: each thread of
the matmul reading the norm's output sums its row's squares once (K loads, next to the K weight loads of its
dot product), then reads `(x * inv) * weight` where it read the norm's output: the norm kernel's arithmetic,
in its order. So the layer's (projection + add, norm) pair is one dispatch fewer than zerotvm's
(projection, add + norm).
"""

from __future__ import annotations

import re

from edgerun.backends.webgpu.wgsl import Body
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node

MATMULS = ("matmul", "matmul_int4")


def foldable_norms(graph: Graph, alias: dict[str, str], outputs: set[str]) -> dict[str, Node]:
    """value -> rms_norm node, for every last-axis float32 RMSNorm with a constant weight whose every reader
    is a matmul reading it as its left operand (so its rows are the matmuls' contiguous K-long rows)."""
    readers: dict[str, list[tuple[Node, int]]] = {}
    for n in graph.nodes:
        for k, v in enumerate(n.inputs):
            if v:
                readers.setdefault(alias.get(v, v), []).append((n, k))
    folded: dict[str, Node] = {}
    for node in graph.nodes:
        out = node.outputs[0]
        if node.op != "rms_norm" or out in outputs or out in alias or len(node.inputs) != 2:
            continue
        x, w = (graph.specs[v] for v in node.inputs)
        users = readers.get(out, [])
        if (x.dtype is not DType.float32 or node.inputs[1] not in graph.constants or w.shape != x.shape[-1:]
                or int(node.attrs.get("normalized_ndim", 1)) != 1):
            continue
        if users and all(u.op in MATMULS and k == 0 and u.inputs[1:].count(out) == 0 for u, k in users):
            folded[out] = node
    return folded


_ROW_START = "let ab = "
_LOAD0 = re.compile(r"\bin0\[([^\[\]]*)\]")


def fold_norm(body: Body, norm: Node, graph: Graph) -> Body:
    """A matmul's body (its left operand bound as in0, rows starting at `ab`) reading `norm`'s input and
    weight instead of its output."""
    x, weight = norm.inputs
    k = graph.specs[x].shape[-1]
    eps = float(norm.attrs.get("eps", 1e-6))
    w = len(body.inputs)
    lines = []
    for line in body.lines:
        if line.startswith(_ROW_START):
            lines += [line, "var ss_a: f32 = 0.0;",
                      f"for (var r: i32 = 0; r < {k}; r = r + 1) {{ let v = in0[ab + r]; ss_a = ss_a + v * v; }}",
                      f"let inv_a = inverseSqrt(ss_a / {float(k)!r} + f32({eps!r}));"]
            continue
        lines.append(_LOAD0.sub(lambda m: f"((in0[{m.group(1)}] * inv_a) * in{w}[{m.group(1)} - ab])", line))
    assert len(lines) == len(body.lines) + 3, "a matmul body sets its row start `ab` once"
    return Body([x, *body.inputs[1:], weight], lines, body.params)
