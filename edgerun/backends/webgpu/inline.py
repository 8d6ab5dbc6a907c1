"""Rasters computed where they are read: a decoder's RoPE (slice, slice, neg, concat, mul, mul, add) in one
dispatch instead of seven, attention's concat inside its softmax and its slices inside their matmuls.

A float32 raster read by exactly one elementwise node, softmax or matmul (or by another such raster), whose
regions do not overlap and whose destination index decodes back to the region's (i0, i1, i2), is not
dispatched: its
reader's kernel calls a WGSL function `f_<n>(i)` that returns the raster's value at flat index i — it finds the
region holding i and reads the source there. An elementwise node between two inline rasters (RoPE's neg) is
inlined the same way. Their sources are read from memory, or are inline themselves.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

from edgerun.backends.webgpu.wgsl import (
    ELEMENTWISE,
    WGSL_TYPE,
    broadcast_strides,
    coords,
    elementwise_expr,
    literal,
    offset_expr,
)
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.region import Region, regions_of

MAX_NUMEL = 1 << 20  # checking a raster's index decoding costs numpy work over its whole output
MAX_REGIONS = 8
# Non-elementwise kernels that read their inputs only through `in{k}[index]` loads, so an inline raster can
# stand in for one (attention's score concat before its softmax, the probability slices before their matmuls).
INDEXED_READERS = ("softmax", "matmul")


def inline_values(graph: Graph, alias: dict[str, str], outputs: set[str]) -> dict[str, Node]:
    """value -> node, for every node computed inside its one reader's kernel (see the module doc)."""
    readers: dict[str, list[Node]] = {}
    for n in graph.nodes:
        for v in n.inputs:
            if v:
                readers.setdefault(alias.get(v, v), []).append(n)
    inline: dict[str, Node] = {}
    for node in reversed(graph.nodes):  # readers first: a raster read by an inline raster may be inline
        out = node.outputs[0]
        users = readers.get(out, [])
        if (out in alias or out in outputs or len(users) != 1 or len(node.outputs) != 1
                or graph.specs[out].dtype is not DType.float32):
            continue
        user = users[0]
        if node.op == "raster":
            wanted = user.op in ELEMENTWISE or user.op in INDEXED_READERS or user.outputs[0] in inline
            if wanted and _decodable(node, graph):
                inline[out] = node
        elif node.op in ELEMENTWISE and user.outputs[0] in inline and user.op == "raster" and \
                all(graph.specs[v].dtype is not DType.float16 for v in node.inputs):
            inline[out] = node
    # An inline elementwise node needs an inline raster among its inputs to be worth it (and to be RoPE-like);
    # without one it goes back to being dispatched (fused the usual way).
    for out, node in list(inline.items()):
        if node.op != "raster" and not any(v in inline for v in node.inputs):
            del inline[out]
    return inline


def _decodable(node: Node, graph: Graph) -> bool:
    out = graph.specs[node.outputs[0]]
    regions = regions_of(node.attrs)
    if not 0 < len(regions) <= MAX_REGIONS or out.numel > MAX_NUMEL or out.numel == 0:
        return False
    owner = np.full(out.numel, -1)
    for k, r in enumerate(regions):
        if min(*r.src_strides, *r.dst_strides) < 0:
            return False
        dst = r.index_grids()[0]
        if dst.size and (dst.min() < 0 or dst.max() >= out.numel or (owner[dst] >= 0).any()
                         or np.unique(dst).size != dst.size):
            return False
        owner[dst] = k
        found, d0, d1, d2 = _decode(np.arange(out.numel), r)
        if not np.array_equal(found, owner == k):
            return False
        i0, i1, i2 = np.meshgrid(*(np.arange(n) for n in r.size), indexing="ij")
        if dst.size and not (np.array_equal(d0[dst], i0.reshape(-1)) and np.array_equal(d1[dst], i1.reshape(-1))
                             and np.array_equal(d2[dst], i2.reshape(-1))):
            return False
    return node.attrs.get("fill") is not None or bool((owner >= 0).all())


def _axes(r: Region) -> list[tuple[int, int]]:
    """(axis, stride) of the destination axes longer than 1, outermost (largest stride) first."""
    return sorted(((a, r.dst_strides[a]) for a in range(3) if r.size[a] > 1), key=lambda t: -t[1])


def _decode(i: np.ndarray, r: Region) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """numpy twin of the WGSL decoding: is i in region r, and its (i0, i1, i2) there."""
    rest = i - r.dst_offset
    found = rest >= 0
    idx = [np.zeros_like(i) for _ in range(3)]
    for a, stride in _axes(r):
        if stride == 0:
            return np.zeros_like(found), idx[0], idx[1], idx[2]
        idx[a] = rest // stride
        rest = rest % stride
        found &= idx[a] < r.size[a]
    found &= rest == 0
    return found, idx[0], idx[1], idx[2]


class InlineWriter:
    """WGSL functions for inline values; `load(v)` gives the binding index of a memory value (the kernel's
    bound list grows as the functions read)."""

    def __init__(self, graph: Graph, inline: dict[str, Node], load: Callable[[str], int]) -> None:
        self.graph, self.inline, self.load = graph, inline, load
        self.functions: dict[str, str] = {}  # value -> WGSL source of its function
        self.names: dict[str, str] = {}

    def read(self, v: str, index: str) -> str:
        """The WGSL expression of value v at flat index `index` (an i32 expression)."""
        if v not in self.inline:
            return f"in{self.load(v)}[{index}]"
        if v not in self.names:
            self.names[v] = f"f_{len(self.names)}"
            node = self.inline[v]
            body = self._raster(node) if node.op == "raster" else self._elementwise(node)
            t = WGSL_TYPE[self.graph.specs[v].dtype]
            self.functions[v] = f"fn {self.names[v]}(i: i32) -> {t} {{\n  " + "\n  ".join(body) + "\n}\n"
        return f"{self.names[v]}({index})"

    def _elementwise(self, node: Node) -> list[str]:
        shape = self.graph.specs[node.outputs[0]].shape
        lines = coords(shape, var="u32(i)")
        args = [self.read(v, offset_expr(broadcast_strides(self.graph.specs[v].shape, shape)))
                for v in node.inputs]
        return [*lines, f"return {elementwise_expr(node, self.graph, args)};"]

    def _raster(self, node: Node) -> list[str]:
        lines: list[str] = []
        for r in regions_of(node.attrs):
            if r.numel == 0:
                continue
            checks, names = ["rest >= 0"], {0: "0", 1: "0", 2: "0"}
            steps = [f"var rest = i - {r.dst_offset};"]
            for a, stride in _axes(r):
                steps += [f"let i{a} = rest / {stride};", f"rest = rest % {stride};"]
                checks.append(f"i{a} < {r.size[a]}")
                names[a] = f"i{a}"
            src = " + ".join([str(r.src_offset),
                              *(f"{names[a]} * {r.src_strides[a]}" for a in range(3) if names[a] != "0")])
            value = self.read(node.inputs[r.src], src)
            lines += ["{", *steps, f"if ({' && '.join([*checks, 'rest == 0'])}) {{ return {value}; }}", "}"]
        fill = node.attrs.get("fill")
        lines.append(f"return {literal(fill or 0.0, DType.float32)};")  # -inf: a max pool's padding
        return lines


_LOAD = re.compile(r"\bin(\d+)\[([^\[\]]*)\]")


def replace_inline_loads(lines: list[str], bound: list[str], writer: InlineWriter) -> list[str]:
    """`in{k}[expr]` where bound[k] is inline becomes a call of its function."""
    def sub(m: re.Match[str]) -> str:
        v = bound[int(m.group(1))]
        return writer.read(v, f"i32({m.group(2)})") if v in writer.inline else m.group(0)
    return [_LOAD.sub(sub, line) for line in lines]
