"""The conv2d variants of the reference kernels, as data: what each computes and what each costs.

CONV_ALGORITHMS is a table of (name, applies, work, kernel). `work` counts what the variant does at these
shapes (GEMM flops, elementwise flops, bytes it streams); the cost model turns that into seconds with the
machine's measured rates, and the cheapest applicable variant wins (MNN's min over algorithms of
Q_alg / P_ba). The search hands its choice to the runtime with the placement (`algorithms`, node name ->
variant) and the reference backend binds that variant; where nothing was chosen it keeps its default kernel (kernels.py). All variants compute the
same convolution; they differ in rounding only (Winograd most), and the tests compare each with im2col.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.lib.stride_tricks import as_strided

from edgerun.ir.graph import Graph, Node
from edgerun.ir.ops.atomic import conv_geometry

ConvKernel = Callable[[list[np.ndarray], dict[str, Any], list[np.ndarray]], None]


class Rates(Protocol):
    """The throughputs a cost needs (edgerun.search.calibrate.BackendProfile has them)."""

    @property
    def gemm_flops_per_s(self) -> float: ...
    @property
    def elementwise_flops_per_s(self) -> float: ...
    @property
    def bytes_per_s(self) -> float: ...


@dataclass(frozen=True)
class ConvShape:
    n: int
    c: int
    h: int  # padded input height and width
    w: int
    o: int
    kh: int
    kw: int
    oh: int
    ow: int
    stride: tuple[int, int]
    dilation: tuple[int, int]
    groups: int

    @staticmethod
    def of(node: Node, graph: Graph) -> ConvShape:
        x, w, y = (graph.specs[node.inputs[0]].shape, graph.specs[node.inputs[1]].shape,
                   graph.specs[node.outputs[0]].shape)
        stride, pads, dil, groups = conv_geometry(node.attrs)
        return ConvShape(x[0], x[1], x[2] + pads[0] + pads[2], x[3] + pads[1] + pads[3], w[0], w[2], w[3],
                         y[2], y[3], stride, dil, groups)

    @property
    def macs(self) -> float:
        return float(self.n * self.o * self.oh * self.ow * (self.c // self.groups) * self.kh * self.kw)


@dataclass(frozen=True)
class Work:
    gemm_flops: float = 0.0
    elementwise_flops: float = 0.0
    bytes: float = 0.0

    def seconds(self, rates: Rates) -> float:
        return (self.gemm_flops / rates.gemm_flops_per_s + self.elementwise_flops / rates.elementwise_flops_per_s
                + self.bytes / rates.bytes_per_s)


@dataclass(frozen=True)
class ConvAlgorithm:
    name: str
    applies: Callable[[ConvShape], bool]
    work: Callable[[ConvShape], Work]
    kernel: ConvKernel


# ---- the variants --------------------------------------------------------------------------------------

def _pad(x: np.ndarray, attrs: Mapping[str, Any], extra: tuple[int, int] = (0, 0)) -> np.ndarray:
    _, (top, left, bottom, right), _, _ = conv_geometry(dict(attrs))
    if not (top or left or bottom or right or any(extra)):
        return x
    return np.pad(x, ((0, 0), (0, 0), (top, bottom + extra[0]), (left, right + extra[1])))


def _windows(xp: np.ndarray, s: ConvShape) -> np.ndarray:
    sn, sc, sh, sw = xp.strides
    return as_strided(xp, (xp.shape[0], xp.shape[1], s.oh, s.ow, s.kh, s.kw),
                      (sn, sc, sh * s.stride[0], sw * s.stride[1], sh * s.dilation[0], sw * s.dilation[1]),
                      writeable=False)


def _shape_of(ins: list[np.ndarray], attrs: dict[str, Any], out: np.ndarray) -> ConvShape:
    x, w = ins[0], ins[1]
    stride, pads, dil, groups = conv_geometry(attrs)
    return ConvShape(x.shape[0], x.shape[1], x.shape[2] + pads[0] + pads[2], x.shape[3] + pads[1] + pads[3],
                     w.shape[0], w.shape[2], w.shape[3], out.shape[2], out.shape[3], stride, dil, groups)


def _add_bias(ins: list[np.ndarray], out: np.ndarray) -> None:
    if len(ins) > 2 and ins[2] is not None:
        out += ins[2].reshape(1, -1, 1, 1)


def _im2col(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    out = outs[0]
    s = _shape_of(ins, attrs, out)
    win = _windows(_pad(ins[0], attrs), s)
    cin_g, oc_g = s.c // s.groups, s.o // s.groups
    for g in range(s.groups):
        cols = win[:, g * cin_g:(g + 1) * cin_g].transpose(0, 2, 3, 1, 4, 5).reshape(s.n, s.oh * s.ow, -1)
        res = np.matmul(cols, ins[1][g * oc_g:(g + 1) * oc_g].reshape(oc_g, -1).T)
        out[:, g * oc_g:(g + 1) * oc_g] = res.transpose(0, 2, 1).reshape(s.n, oc_g, s.oh, s.ow)
    _add_bias(ins, out)


def _pointwise(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    out = outs[0]
    s = _shape_of(ins, attrs, out)
    xp = _pad(ins[0], attrs)
    np.matmul(ins[1].reshape(s.o, s.c), xp.reshape(s.n, s.c, s.oh * s.ow), out=out.reshape(s.n, s.o, -1))
    _add_bias(ins, out)


def _depthwise(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    out = outs[0]
    s = _shape_of(ins, attrs, out)
    win = _windows(_pad(ins[0], attrs), s)
    w = ins[1]
    out[...] = 0
    for i in range(s.kh):
        for j in range(s.kw):
            out += win[:, :, :, :, i, j] * w[None, :, 0, i, j, None, None]
    _add_bias(ins, out)


# Winograd F(2x2, 3x3): 16 GEMMs of O x C on 4x4 input tiles instead of 9 taps per output; 2.25x fewer
# multiplications, paid for by input and output transforms that stream the data several times.
_G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], np.float32)


def _input_transform(d: np.ndarray, axis: int) -> np.ndarray:
    d0, d1, d2, d3 = (np.take(d, i, axis=axis) for i in range(4))
    return np.stack([d0 - d2, d1 + d2, d2 - d1, d1 - d3], axis=axis)  # B^T d


def _output_transform(m: np.ndarray, axis: int) -> np.ndarray:
    m0, m1, m2, m3 = (np.take(m, i, axis=axis) for i in range(4))
    return np.stack([m0 + m1 + m2, m1 - m2 - m3], axis=axis)  # A^T m


def _winograd(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    out = outs[0]
    s = _shape_of(ins, attrs, out)
    th, tw = -(-s.oh // 2), -(-s.ow // 2)
    xp = np.ascontiguousarray(_pad(ins[0], attrs, (2 * th + 2 - s.h, 2 * tw + 2 - s.w)))
    sn, sc, sh, sw = xp.strides
    tiles = as_strided(xp, (s.n, s.c, th, tw, 4, 4), (sn, sc, 2 * sh, 2 * sw, sh, sw), writeable=False)
    v = _input_transform(_input_transform(tiles, 4), 5)  # N, C, th, tw, 4, 4
    v = v.transpose(4, 5, 1, 0, 2, 3).reshape(16, s.c, s.n * th * tw)
    u = np.einsum("ij,ocjk,lk->iloc", _G, ins[1], _G).reshape(16, s.o, s.c).astype(out.dtype)
    m = np.matmul(u, v).reshape(4, 4, s.o, s.n, th, tw)
    y = _output_transform(_output_transform(m, 0), 1)  # 2, 2, O, N, th, tw
    y = y.transpose(3, 2, 4, 0, 5, 1).reshape(s.n, s.o, 2 * th, 2 * tw)
    out[...] = y[:, :, :s.oh, :s.ow]
    _add_bias(ins, out)


def _im2col_work(s: ConvShape) -> Work:
    cols = s.n * s.oh * s.ow * (s.c // s.groups) * s.kh * s.kw * 4.0
    return Work(gemm_flops=2 * s.macs, bytes=2 * cols + 8.0 * s.n * s.o * s.oh * s.ow)


def _winograd_work(s: ConvShape) -> Work:
    tiles = s.n * -(-s.oh // 2) * -(-s.ow // 2)
    transformed = 16.0 * tiles * (s.c + s.o) * 4  # V and M, written and read by the transforms
    return Work(gemm_flops=2.0 * 16 * tiles * s.c * s.o, elementwise_flops=32.0 * tiles * (s.c + s.o),
                bytes=4 * transformed + 16.0 * s.c * s.o * 4)


CONV_ALGORITHMS: tuple[ConvAlgorithm, ...] = (
    ConvAlgorithm("pointwise_gemm",
                  lambda s: s.groups == 1 and s.kh == s.kw == 1 and s.stride == (1, 1),
                  lambda s: Work(gemm_flops=2 * s.macs), _pointwise),
    ConvAlgorithm("depthwise_direct",
                  lambda s: s.groups == s.c == s.o,
                  lambda s: Work(elementwise_flops=2 * s.macs, bytes=12.0 * s.kh * s.kw * s.n * s.o * s.oh * s.ow),
                  _depthwise),
    ConvAlgorithm("winograd_f2x3",
                  lambda s: s.groups == 1 and s.kh == s.kw == 3 and s.stride == (1, 1) and s.dilation == (1, 1),
                  _winograd_work, _winograd),
    ConvAlgorithm("im2col_gemm", lambda s: True, _im2col_work, _im2col),
)
BY_NAME = {a.name: a for a in CONV_ALGORITHMS}


def chosen_conv_kernel(name: str | None, node: Node, ins: list[np.ndarray], out: np.ndarray) -> ConvKernel | None:
    """The kernel of algorithm `name` for `node`, if there is one of that name and it applies."""
    chosen = BY_NAME.get(name or "")
    if chosen is not None and chosen.applies(_shape_of(ins, node.attrs, out)):
        return chosen.kernel
    return None
