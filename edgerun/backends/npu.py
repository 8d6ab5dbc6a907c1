"""The `npu` backend: int8 programs' integer products on the emulated Edge-TPU-class device (edgerun.accel).

What it claims, and why only that: `matmul_integer` and `conv_integer` on int8/uint8 operands, the two ops
an int8-static or int8-dynamic program spends its work in. The device runs them as the seed's GEMM: the
host shifts each operand by its zero point (values in [-255, 255], 9 bits), im2col-lowers a convolution,
and the accel Tensorizer slices both operands into bit planes, runs 128x128-tile conv2D instructions on the
device (int8 operands, int32 accumulation, 8-bit outputs that provably never saturate) and recombines
the planes on the host. Every step is integer-exact, so the int32 result equals the oracle kernel bit for
bit. A product is claimed only while K * 255^2 < 2^31: the oracle's int32 then never wraps and the sliced
sums stay exact. Ops whose 8-bit output the device would requantize (requantize, quantize_linear) are not
claimed: the device's rounding (float multiplier, np.rint) is not the IR's exact fixed-point rounding.

The declared throughput is the device-time model's (the seed's Table 1 and ~6 ms per MB transferred), not
this CPU's: the emulation computes on the host, the figures say what the device would take.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgerun.accel.costmodel import SECONDS_PER_BYTE, TABLE1
from edgerun.accel.quant import SLICED
from edgerun.accel.runtime import Runtime
from edgerun.backends.base import Backend, CompiledPartition, OpSupport, Throughput
from edgerun.errors import UnsupportedOpError
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.ops.atomic import conv_geometry

INT32_LIMIT = 2**31
SHIFTED_MAX = 255  # |q - zero_point| for int8 or uint8 data
SHIFTED_BITS = 9  # bits of a shifted operand: the bit planes each side of a product
TILE_K = 255  # the Tensorizer's K block for bit-plane products (255 plane products fit one 8-bit output)
_QUANT = frozenset({DType.int8, DType.uint8, DType.int32})


def _exact_k(k: int) -> bool:
    return k > 0 and k * SHIFTED_MAX * SHIFTED_MAX < INT32_LIMIT


def _matmul_fits(node: Node, graph: Graph) -> bool:
    return _exact_k(graph.specs[node.inputs[0]].shape[-1])


def _conv_fits(node: Node, graph: Graph) -> bool:
    _, cin_g, kh, kw = graph.specs[node.inputs[1]].shape
    return _exact_k(cin_g * kh * kw)


def _device_throughput() -> Throughput:
    """The device-time model as the search's figures: a product of 9-bit operands is 9 x 9 bit-plane
    products, each conv2D result covering a K block of 255 multiply-adds (2 flops each)."""
    ops, rps = TABLE1["conv2D"]
    planes = SHIFTED_BITS * SHIFTED_BITS
    transfer = 1.0 / SECONDS_PER_BYTE
    return Throughput(flops_per_s=rps * 2 * TILE_K / planes, bytes_per_s=transfer, dispatch_s=1.0 / ops,
                      transfer_bytes_per_s=transfer, transfer_latency_s=1.0 / ops)


class NpuBackend(Backend):
    name = "npu"
    supported = {
        "matmul_integer": OpSupport(dtypes=_QUANT, check=_matmul_fits),
        "conv_integer": OpSupport(dtypes=_QUANT, max_rank=4, check=_conv_fits),
    }
    throughput = _device_throughput()

    def __init__(self, devices: int = 1) -> None:
        self.devices = devices
        self._runtime: Runtime | None = None
        self._lock = threading.Lock()

    @property
    def runtime(self) -> Runtime:
        """The emulated device(s), started on first use. BLAS threads are left alone (blas_threads=None):
        this runtime lives as long as the process and must not pin the whole program to one thread."""
        with self._lock:
            if self._runtime is None:
                self._runtime = Runtime(self.devices, blas_threads=None)
            return self._runtime

    def device_stats(self) -> dict[str, Any]:
        """Instructions, bytes moved and modelled device seconds so far (the accel runtime's `stats`)."""
        return self.runtime.stats()

    def settings(self) -> dict[str, object]:
        return {"devices": self.devices}

    def compile(self, subgraph: Graph) -> CompiledPartition:
        for node in subgraph.nodes:
            if not self.supports(node, subgraph):
                raise UnsupportedOpError(node.op, module_path=node.meta.get("module_path"),
                                         detail="not supported by the npu backend")
        runtime = self.runtime
        nodes = list(subgraph.nodes)
        consts = subgraph.constants

        def run(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
            env: dict[str, np.ndarray] = {**consts, **dict(zip(subgraph.inputs, inputs))}
            with np.errstate(all="ignore"):  # the emulator's float64 round trip: its warnings are its own
                for node in nodes:
                    args = [env[v] for v in node.inputs]
                    if node.op == "matmul_integer":
                        env[node.outputs[0]] = _matmul_integer(runtime, *args)
                    else:
                        env[node.outputs[0]] = _conv_integer(runtime, *args, attrs=node.attrs)
            for name, out in zip(subgraph.outputs, outputs):
                out[...] = env[name]

        return CompiledPartition(self.name, subgraph, run, info={"devices": self.devices, "emulated": True})


def _device_gemm(runtime: Runtime, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Exact integer (M, K) @ (K, N) on the device: bit-plane conv2D instructions, recombined exactly."""
    out = runtime.gemm(a.astype(np.float64), b.astype(np.float64), method="conv2D", flags=SLICED)
    return np.rint(out).astype(np.int64).astype(np.int32)


def _matmul_integer(runtime: Runtime, a: np.ndarray, b: np.ndarray, a_zp: np.ndarray,
                    b_zp: np.ndarray) -> np.ndarray:
    sa = a.astype(np.int32) - a_zp.astype(np.int32)
    sb = b.astype(np.int32) - b_zp.astype(np.int32)
    batch = np.broadcast_shapes(sa.shape[:-2], sb.shape[:-2])
    sa = np.broadcast_to(sa, (*batch, *sa.shape[-2:]))
    sb = np.broadcast_to(sb, (*batch, *sb.shape[-2:]))
    out = np.empty((*batch, sa.shape[-2], sb.shape[-1]), dtype=np.int32)
    for idx in np.ndindex(*batch):
        out[idx] = _device_gemm(runtime, sa[idx], sb[idx])
    return out


def _conv_integer(runtime: Runtime, x: np.ndarray, w: np.ndarray, x_zp: np.ndarray, w_zp: np.ndarray, *,
                  attrs: dict[str, Any]) -> np.ndarray:
    """im2col on the host (padding with a real zero after the shift, as the oracle), GEMM on the device."""
    stride, (top, left, bottom, right), dil, groups = conv_geometry(attrs)
    xs = np.pad(x.astype(np.int32) - int(x_zp.reshape(-1)[0]), ((0, 0), (0, 0), (top, bottom), (left, right)))
    ws = w.astype(np.int32) - w_zp.astype(np.int32)
    n, c, hp, wp = xs.shape
    oc, cin_g, kh, kw = w.shape
    oh = (hp - dil[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wp - dil[1] * (kw - 1) - 1) // stride[1] + 1
    sn, sc, sh, sw = xs.strides
    win = np.lib.stride_tricks.as_strided(xs, (n, c, oh, ow, kh, kw),
                                          (sn, sc, sh * stride[0], sw * stride[1], sh * dil[0], sw * dil[1]),
                                          writeable=False)
    out = np.empty((n, oc, oh, ow), dtype=np.int32)
    oc_g = oc // groups
    for g in range(groups):
        cols = win[:, g * cin_g:(g + 1) * cin_g].transpose(0, 2, 3, 1, 4, 5).reshape(n * oh * ow, -1)
        wg = ws[g * oc_g:(g + 1) * oc_g].reshape(oc_g, -1)
        res = _device_gemm(runtime, cols, wg.T)  # (N*OH*OW, OCg)
        out[:, g * oc_g:(g + 1) * oc_g] = res.reshape(n, oh, ow, oc_g).transpose(0, 3, 1, 2)
    return out


def create_backend(devices: int = 1) -> NpuBackend:
    return NpuBackend(devices)
