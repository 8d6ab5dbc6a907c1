"""The webgpu backend: WGSL kernels for every atomic op and raster, run through wgpu-py (wgpu-native).

A partition is lowered to a dispatch list (lowering.py; elementwise chains and matmul/conv + bias +
activation fused into one dispatch each), its values are planned into one device buffer, and a call is one
command encoder: input uploads, the dispatches, output copies, one submit (runner.py). After the first
call the dispatch list is captured and replayed, with guards that fall back to a fresh encode.

What it claims (`supported`, the contract): float32, int32, int64 and bool values, and float16 where the
adapter has `shader-f16` (stored as f16, computed in f32). int64 is stored as int32 (WGSL has no 64-bit
integers; values outside int32 are an EdgerunError at upload). int8 and uint8 values are stored packed, 4 to a
u32 word, and claimed only by the quantized ops (int8.py: quantize/dequantize/dynamic quantize/requantize,
integer matmul and conv, bit for bit the oracle's) and matmul_int4's packed constants; other ops on int8 go
elsewhere. Integer div/mod/pow are not claimed (the reference raises on division by zero, a shader cannot).
"""

from __future__ import annotations

from edgerun.backends.base import Backend, CompiledPartition, OpSupport, Throughput
from edgerun.backends.webgpu.attention import bindings, claimable
from edgerun.backends.webgpu.device import GpuDevice, get_device
from edgerun.backends.webgpu.int8 import dequantize_claimable, requantize_claimable
from edgerun.backends.webgpu.runner import INT4_ACCUMULATE, PartitionRunner
from edgerun.backends.webgpu.wgsl import COMPARE, FLOAT_UNARY, INT_UNARY, LOGICAL, REDUCE
from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node

_F = frozenset({DType.float32, DType.float16})
_NUM = frozenset({*_F, DType.int32, DType.int64})
_B = frozenset({DType.bool})
_ALL = frozenset({*_NUM, DType.bool})
_Q = frozenset({DType.int8, DType.uint8})


def _int_ok(node: Node, graph: Graph) -> bool:
    return graph.specs[node.inputs[0]].dtype is not DType.bool


def _float32_data(node: Node, graph: Graph) -> bool:
    return graph.specs[node.inputs[0]].dtype is DType.float32


def _packed_constants(node: Node, graph: Graph) -> bool:
    """uint8 values exist on the device only as constants (packed int4 weights and zero points); float
    activations only (the kernel has no int8 rounding of its input)."""
    return (node.attrs.get("activations") in (None, "float")
            and all(v in graph.constants for v in node.inputs[1:] if v and graph.specs[v].dtype is DType.uint8))


SUPPORTED: dict[str, OpSupport] = {
    **{op: OpSupport(_F) for op in FLOAT_UNARY if op not in INT_UNARY},
    **{op: OpSupport(_NUM) for op in INT_UNARY},
    **{op: OpSupport(_NUM) for op in ("add", "sub", "mul", "maximum", "minimum")},
    **{op: OpSupport(_F) for op in ("div", "mod", "pow")},
    **{op: OpSupport(_ALL, check=_int_ok) for op in COMPARE},
    **{op: OpSupport(_B) for op in (*LOGICAL, "logical_not")},
    "where": OpSupport(_ALL),
    "cast": OpSupport(_ALL),
    **{op: OpSupport(_NUM) for op in REDUCE},
    "reduce_mean": OpSupport(_F),
    "argmax": OpSupport(_NUM, check=_int_ok),
    "argmin": OpSupport(_NUM, check=_int_ok),
    "matmul": OpSupport(_NUM),
    "matmul_int4": OpSupport(frozenset({DType.float32, DType.uint8}), check=_packed_constants),
    "conv2d": OpSupport(_F),
    "max_pool2d": OpSupport(_F),
    "avg_pool2d": OpSupport(_F),
    "gather": OpSupport(_ALL | _Q),  # int8/uint8 data: a quantized embedding table (int8.py)
    "scatter_add": OpSupport(_NUM, check=_float32_data),  # an embedding's gradient (wgsl.py: no atomics)
    # the quantized ops (int8.py), int8/uint8 packed 4 to a word
    "quantize_linear": OpSupport(frozenset({*_Q, DType.float32})),
    "dequantize_linear": OpSupport(frozenset({*_Q, DType.int32, DType.float32}), check=dequantize_claimable),
    "dynamic_quantize": OpSupport(frozenset({*_Q, DType.float32})),
    "requantize": OpSupport(frozenset({*_Q, DType.int32, DType.float32}), check=requantize_claimable),
    "matmul_integer": OpSupport(frozenset({*_Q, DType.int32})),
    "conv_integer": OpSupport(frozenset({*_Q, DType.int32})),
    "raster": OpSupport(_ALL),
    # a KV-cache append; in place where nothing reads the cache after it (update.py)
    "update_slice": OpSupport(frozenset({DType.float32, DType.int32, DType.int64})),
}


def _last_axis_norm(node: Node, graph: Graph) -> bool:
    """A norm over the last axis whose weight and bias (when there) are that axis's length."""
    x = graph.specs[node.inputs[0]]
    return int(node.attrs.get("normalized_ndim", 1)) == 1 and all(
        graph.specs[v].shape == x.shape[-1:] for v in node.inputs[1:] if v)


# Composites run whole, one dispatch each (the decoder's RMSNorm, softmax, the encoders' LayerNorm, a decoder
# layer's attention against its KV cache: attention.py) instead of the 2-20 dispatches of their decomposition.
COMPOSITES: dict[str, OpSupport] = {
    "cache_attention": OpSupport(frozenset({DType.float32, DType.int32, DType.int64}), check=claimable),
    "softmax": OpSupport(_F),
    "rms_norm": OpSupport(_F, check=_last_axis_norm),
    "layer_norm": OpSupport(_F, check=_last_axis_norm),
}


class WebGpuBackend(Backend):
    name = "webgpu"
    extra = "webgpu"
    library = "wgpu"
    supported = SUPPORTED
    composites = COMPOSITES
    # A discrete GPU would be far faster; these describe lavapipe on a few CPU cores, the CI adapter.
    throughput = Throughput(flops_per_s=2e9, bytes_per_s=2e9, dispatch_s=2e-5, transfer_bytes_per_s=4e9,
                            transfer_latency_s=2e-4)

    def __init__(self, fuse: bool = True, replay: bool = True, int4_accumulate: str = "f32",
                 keep_state: bool = True) -> None:
        """`int4_accumulate="f16"`: matmul_int4 sums in f16 within each group where the adapter has
        shader-f16 (f32 otherwise); the default f32 is the CPU path's arithmetic (greedy tokens equal).
        `keep_state=False`: program state crosses to the host every call (the runner's `keep_state` not
        offered; for comparisons)."""
        if int4_accumulate not in INT4_ACCUMULATE:
            raise EdgerunError(f"webgpu: int4_accumulate must be one of {INT4_ACCUMULATE}, not {int4_accumulate!r}")
        self.fuse = fuse
        self.replay = replay
        self.int4_accumulate = int4_accumulate
        self.keep_state = keep_state

    @property
    def gpu(self) -> GpuDevice:
        return get_device()

    def supports(self, node: Node, graph: Graph) -> bool:
        if not super().supports(node, graph):
            return False
        return self.gpu.has_f16 or all(graph.specs[v].dtype is not DType.float16
                                       for v in (*node.inputs, *node.outputs) if v)

    def keeps_whole(self, node: Node, graph: Graph) -> bool:
        if node.op == "cache_attention" and bindings(node) > self.gpu.limits.max_storage_buffers:
            return False  # the adapter cannot bind the kernel's buffers: its decomposition runs instead
        return super().keeps_whole(node, graph)

    def compile(self, subgraph: Graph) -> CompiledPartition:
        for node in subgraph.nodes:
            if not self.supports(node, subgraph):
                raise UnsupportedOpError(node.op, module_path=node.meta.get("module_path"),
                                         detail="not supported by the webgpu backend")
        gpu = self.gpu
        runner = PartitionRunner(gpu, subgraph, fuse=self.fuse, replay=self.replay,
                                 int4_accumulate=self.int4_accumulate)
        return CompiledPartition(self.name, subgraph, runner.run,
                                 keep_state=runner.keep_state if self.keep_state else None,
                                 info={"dispatches": len(runner.kernels), "nodes": len(subgraph.nodes),
                                       "arena_bytes": runner.arena_bytes, "adapter": gpu.description,
                                       "shader_f16": gpu.has_f16, "int4_accumulate": runner.int4_accumulate,
                                       "runner": runner})


def create_backend(fuse: bool = True, replay: bool = True, int4_accumulate: str = "f32",
                   keep_state: bool = True) -> WebGpuBackend:
    get_device()  # no adapter: BackendUnavailableError now, naming what to install
    return WebGpuBackend(fuse, replay, int4_accumulate, keep_state)
