"""The cost model: seconds of each node on each backend, from counted work and measured throughput.

seconds(node, backend) = max(flops / flops_per_s[class], bytes / bytes_per_s) + dispatch, where the class is
gemm (matmul), conv (conv2d), integer gemm (matmul_integer), integer conv (conv_integer: measured as ONNX
Runtime's fused QLinearConv, so its int32 bias add and requantize count as fused into it, below) or
elementwise, and every rate comes from calibration (MNN's Q_alg / P_ba, with
P measured instead of derived from the clock). Where a backend offers several algorithms for an op (the
reference backend's convolutions), the node costs its cheapest applicable one. Partitions add a fixed
scheduling cost per call, and values crossing between backends that do not share host memory add transfer
time; both are charged by the placement search, which sees the partitions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from edgerun.backends.base import Backend, composite_work, is_composite, node_work
from edgerun.ir.graph import Graph, Node
from edgerun.search.calibrate import BackendProfile


@dataclass(frozen=True)
class CostTable:
    """seconds[k, b]: node k on backend b (inf where b does not support the node)."""

    backends: list[str]
    seconds: np.ndarray
    out_bytes: np.ndarray  # bytes of each node's outputs, for transfer costs
    partition_s: np.ndarray  # per backend
    transfer_s_per_byte: np.ndarray  # per backend, each way
    transfer_latency_s: np.ndarray
    # fused_saving[k, b]: seconds node k costs less when node k-1 runs on the same backend b, which fuses
    # it into its producer (ORT folds an activation or bias add into the Conv or MatMul before it).
    fused_saving: np.ndarray


def node_seconds(node: Node, graph: Graph, profile: BackendProfile, backend: Backend,
                 work: tuple[float, float] | None = None) -> float:
    choice = cheapest_algorithm(node, graph, profile, backend)
    if choice is not None:
        return choice[1] + profile.dispatch_s
    flops, moved = work or node_work(node, graph)
    dispatch = profile.dispatch_s
    if is_composite(node.op):  # whole: one kernel over its inputs and outputs; else each piece separately
        pieces = composite_work(node, graph)
        if backend.keeps_whole(node, graph):
            moved = pieces.boundary_bytes
        else:
            dispatch *= pieces.pieces
    return max(flops / flops_rate(node.op, profile), moved / profile.bytes_per_s) + dispatch


def flops_rate(op: str, profile: BackendProfile) -> float:
    """The measured rate `op`'s work runs at: gemm, conv, their integer forms (at the float rate where the
    backend's integer rate was not measured), or elementwise."""
    if op == "matmul_integer":
        return profile.integer_gemm_flops_per_s or profile.gemm_flops_per_s
    if op == "conv_integer":
        return profile.integer_conv_flops_per_s or profile.conv_flops_per_s
    return (profile.gemm_flops_per_s if op == "matmul" else
            profile.conv_flops_per_s if op == "conv2d" else profile.elementwise_flops_per_s)


def cost_table(graph: Graph, backends: Mapping[str, Backend], profiles: Mapping[str, BackendProfile],
               order: Sequence[str] | None = None) -> CostTable:
    names = list(order or backends)
    works = [_work(n, graph) for n in graph.nodes]  # once per node, shared by every backend
    seconds = np.full((len(graph.nodes), len(names)), math.inf)
    for b, name in enumerate(names):
        backend, profile = backends[name], profiles[name]
        for k, node in enumerate(graph.nodes):
            if backend.supports(node, graph):
                seconds[k, b] = node_seconds(node, graph, profile, backend, works[k])
    out_bytes = np.array([sum(graph.specs[o].nbytes for o in n.outputs) for n in graph.nodes], float)
    fused = np.zeros_like(seconds)
    fusable = fusable_into_previous(graph)
    for b, name in enumerate(names):
        if backends[name].fuses_activations:
            fused[fusable, b] = seconds[fusable, b] - profiles[name].dispatch_s
    return CostTable(names, seconds, out_bytes,
                     np.array([profiles[n].partition_s for n in names]),
                     np.array([1 / profiles[n].transfer_bytes_per_s for n in names]),
                     np.array([profiles[n].transfer_latency_s for n in names]), np.nan_to_num(fused, posinf=0.0))


def cheapest_algorithm(node: Node, graph: Graph, profile: BackendProfile,
                       backend: Backend) -> tuple[str, float] | None:
    """(name, modelled seconds) of the cheapest of the backend's algorithm choices for `node`, if it has any:
    each choice's work at the measured rates, times that choice's calibrated measured/modelled ratio."""
    costed = [(c.name, c.work.seconds(profile) * profile.algorithm_scale.get(c.name, 1.0))
              for c in backend.algorithm_choices(node, graph)]
    return min(costed, key=lambda c: c[1]) if costed else None


def _work(node: Node, graph: Graph) -> tuple[float, float]:
    if node.op == "raster":
        # Every output element is written once (overwrites are rare): no need to walk hundreds of regions.
        return 0.0, 2.0 * graph.specs[node.outputs[0]].nbytes
    return node_work(node, graph)


FUSING_PRODUCERS = frozenset({"conv2d", "matmul", "conv_integer", "matmul_integer"})
# requantize after conv_integer / matmul_integer (+ int32 bias add): ONNX Runtime's QLinearConv /
# QLinearMatMul / QGemm, one kernel when together
FUSED_CONSUMERS = frozenset({"maximum", "minimum", "add", "relu", "clamp", "requantize"})


def fusable_into_previous(graph: Graph) -> list[int]:
    """Nodes an activation-fusing backend folds into the node before them: a max, min, add or requantize
    reading the previous node's output, when that one is a conv or matmul or itself folded (relu6 is max then
    min; QLinearConv is conv_integer, bias add, requantize; QLinearMatMul / QGemm the same after matmul_integer)."""
    folds = [False] * len(graph.nodes)
    for k in range(1, len(graph.nodes)):
        node, prev = graph.nodes[k], graph.nodes[k - 1]
        if node.op in FUSED_CONSUMERS and prev.outputs[0] in node.inputs and \
                (prev.op in FUSING_PRODUCERS or folds[k - 1]):
            folds[k] = True
    return [k for k, folded in enumerate(folds) if folded]
