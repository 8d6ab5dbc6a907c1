"""The webgpu backend op by op, on the machine's real WebGPU adapter (lavapipe here): every atomic op and raster
against the reference kernels, edge cases included, and the adapter's limits as clear errors.

Ops are batched into a few multi-output graphs so one compile covers many kernels (lavapipe compiles a
shader in ~0.1 s).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

pytest.importorskip("wgpu")

from backends_testkit import assert_matches_reference

from edgerun.errors import BackendUnavailableError, EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.decompose import decomposed
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret

try:
    from edgerun.backends.webgpu import WebGpuBackend, get_device
    from edgerun.backends.webgpu.runner import PartitionRunner

    get_device()
except BackendUnavailableError as exc:  # pragma: no cover - CI installs lavapipe
    pytest.skip(f"no WebGPU adapter: {exc}", allow_module_level=True)

RNG = np.random.default_rng(0)
UNFUSED = WebGpuBackend(fuse=False)


def build(inputs: Sequence[np.ndarray], body: Callable[[Builder, list[str]], list[str]],
          constant: Sequence[bool] = ()) -> tuple[Graph, list[np.ndarray]]:
    g = Graph()
    b = Builder(g)
    names, feeds = [], []
    for k, value in enumerate(inputs):
        if k < len(constant) and constant[k]:
            names.append(g.add_constant(np.asarray(value)))
        else:
            names.append(g.add_input(f"in{k}", TensorSpec(np.shape(value), DType.of(value))))
            feeds.append(value)
    g.outputs = body(b, names)
    return g, feeds


def check(graph: Graph, feeds: list[np.ndarray], **tol: Any) -> None:
    got = UNFUSED.compile(graph)(*feeds)
    assert_matches_reference(graph, feeds, got, **tol)


def f32(*shape: int, low: float = -3.0, high: float = 3.0) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


def test_float_unary_ops() -> None:
    x = f32(4, 33)
    x[0, :4] = [0.0, -0.0, 2.5, -2.5]  # round half to even, sign of zero
    pos = f32(4, 33, low=0.05)
    big = np.array([[-30.0, -8.0, 8.0, 30.0, 0.0, 1e-3]], np.float32)  # tanh/sigmoid/erf tails

    def body(b: Builder, n: list[str]) -> list[str]:
        outs = [b.emit(op, [n[0]]) for op in ("exp", "tanh", "sigmoid", "erf", "sin", "cos", "floor", "ceil",
                                              "round", "neg", "abs", "sign", "reciprocal")]
        outs += [b.emit(op, [n[1]]) for op in ("log", "sqrt", "rsqrt")]
        outs += [b.emit(op, [n[2]]) for op in ("tanh", "sigmoid", "erf", "exp")]
        return outs
    check(*build([x, pos, big], body), rtol=2e-6, atol=1e-6)


def test_binary_ops_broadcast_and_edges() -> None:
    a, b_ = f32(3, 1, 5), f32(4, 5)
    b_[0, 0] = 0.0
    bases = np.array([-2.0, -2.0, -8.0, 0.0, 0.0, 3.0, 2.0], np.float32)
    exps = np.array([2.0, 3.0, 0.5, 2.0, -1.0, 0.0, -1.5], np.float32)

    def body(b: Builder, n: list[str]) -> list[str]:
        outs = [b.emit(op, [n[0], n[1]]) for op in ("add", "sub", "mul", "maximum", "minimum", "div")]
        outs += [b.emit("div", [n[0], n[1]], rounding=r) for r in ("floor", "trunc")]
        outs += [b.emit("mod", [n[0], n[1]], fmod=f) for f in (False, True)]
        outs.append(b.emit("pow", [n[2], n[3]]))
        return outs
    check(*build([a, b_, bases, exps], body), rtol=1e-5, atol=1e-5)


def test_integer_compare_logical_where_cast() -> None:
    i64 = RNG.integers(-9, 10, (3, 4)).astype(np.int64)
    i32 = RNG.integers(-9, 10, (1, 4)).astype(np.int32)
    # +3e9 and +inf saturate to INT_MAX on both (the reference wrapped them to INT_MIN until the bug that
    # bringing webgpu up found was fixed; docs/webgpu-migration.md).
    fl = np.array([[np.nan, 3.7, -3.7, 3e9], [-3e9, np.inf, 2.0**31, -np.inf]], np.float32)
    m = RNG.random((3, 4)) > 0.5

    def body(b: Builder, n: list[str]) -> list[str]:
        outs = [b.emit(op, [n[0], n[0]]) for op in ("add", "sub", "mul", "maximum", "minimum")]
        outs += [b.emit(op, [n[0]]) for op in ("neg", "abs", "sign")]
        outs += [b.emit(op, [n[1], n[1]]) for op in ("add", "maximum")]
        outs += [b.emit(op, [n[0], b.emit("cast", [n[1]], dtype="int64")]) for op in
                 ("eq", "ne", "lt", "le", "gt", "ge")]
        outs += [b.emit(op, [n[3], outs[-1]]) for op in ("logical_and", "logical_or", "logical_xor")]
        outs.append(b.emit("logical_not", [n[3]]))
        outs.append(b.emit("where", [n[3], n[0], outs[0]]))
        outs += [b.emit("cast", [n[2]], dtype=d) for d in ("int32", "bool")]
        outs += [b.emit("cast", [n[0]], dtype=d) for d in ("float32", "bool", "int32")]
        outs.append(b.emit("cast", [n[3]], dtype="float32"))
        return outs
    check(*build([i64, i32, fl, m], body))


def test_reductions_and_argmax() -> None:
    x = f32(2, 3, 5)
    ties = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, -1.0]], np.float32)
    ints = RNG.integers(-5, 5, (3, 4)).astype(np.int32)

    def body(b: Builder, n: list[str]) -> list[str]:
        outs = [b.emit(op, [n[0]], axes=axes, keepdims=keep)
                for op in ("reduce_sum", "reduce_mean", "reduce_max", "reduce_min")
                for axes, keep in ((None, False), ([1], True), ([0, 2], False), ([-1], False))]
        outs += [b.emit(op, [n[1]], axis=1, select_last_index=last)
                 for op in ("argmax", "argmin") for last in (False, True)]
        outs.append(b.emit("reduce_sum", [n[2]], axes=[0], keepdims=False))
        outs.append(b.emit("argmax", [n[0]], axis=0, keepdims=True))
        return outs
    check(*build([x, ties, ints], body), rtol=1e-5, atol=1e-6)


def test_matmul_conv_pool() -> None:
    a, bm = f32(2, 1, 3, 7), f32(4, 7, 5)
    x = f32(1, 4, 9, 8)
    w, wd, bias = f32(6, 2, 3, 3), f32(4, 1, 3, 3), f32(6)

    def body(b: Builder, n: list[str]) -> list[str]:
        outs = [b.emit("matmul", [n[0], n[1]])]
        outs.append(b.emit("conv2d", [n[2], n[3], n[5]], stride=[2, 1], padding=[1, 0, 2, 1], dilation=[1, 2],
                           groups=2))
        outs.append(b.emit("conv2d", [n[2], n[4]], stride=1, padding=[1, 1, 1, 1], groups=4))
        outs.append(b.emit("max_pool2d", [n[2]], kernel=3, stride=2, padding=[1, 1, 1, 1], ceil_mode=True))
        outs += [b.emit("avg_pool2d", [n[2]], kernel=3, stride=2, padding=[1, 1, 1, 1], ceil_mode=True,
                        count_include_pad=inc) for inc in (True, False)]
        return outs
    check(*build([a, bm, x, w, wd, bias], body, constant=[False, False, False, True, True, True]),
          rtol=1e-5, atol=1e-5)


def test_gather_and_its_range_check() -> None:
    table = f32(6, 3)
    idx = np.array([[0, -1], [5, 2]], np.int64)
    flags = RNG.random((2, 6)) > 0.5

    def body(b: Builder, n: list[str]) -> list[str]:
        return [b.emit("gather", [n[0], n[1]], axis=0), b.emit("gather", [n[0], n[1]], axis=1),
                b.emit("gather", [n[2], n[1]], axis=1)]
    small_idx = np.array([[0, -1], [2, 1]], np.int64)
    graph, _ = build([table, small_idx, flags], body)
    check(graph, [table, small_idx, flags])
    graph, _ = build([table, idx, flags], lambda b, n: [b.emit("gather", [n[0], n[1]], axis=0)])
    part = UNFUSED.compile(graph)
    np.testing.assert_array_equal(part(table, idx, flags)[0], table[[[0, 5], [5, 2]]])
    with pytest.raises(EdgerunError, match="gather index out of range"):
        part(table, np.array([[0, 6], [1, 1]], np.int64), flags)


def test_raster_fill_sources_negative_strides_and_overlap() -> None:
    x, y = f32(4, 6), f32(3, 6)
    regions = [
        [0, 0, 0, 6, 1, 0, 0, 6, 1, 1, 4, 6],  # x into rows 0..3
        [1, 17, 0, -6, -1, 24, 0, 6, 1, 1, 3, 6],  # y reversed on both axes into rows 4..6
        [0, 5, 0, 6, 0, 44, 0, 0, 1, 1, 1, 4],  # a broadcast (zero stride) overlapping the end of rows 7
    ]

    def body(b: Builder, n: list[str]) -> list[str]:
        return [b.emit("raster", [n[0], n[1]], regions=regions, shape=[9, 6], fill=-1.5),
                b.emit("raster", [n[0]], regions=[[0, 0, 0, 1, 6, 0, 0, 4, 1, 1, 6, 4]], shape=[6, 4])]
    check(*build([x, y], body))


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")  # the reference's f16 cast
def test_float16_where_the_adapter_has_shader_f16() -> None:
    if not get_device().has_f16:
        pytest.skip("this adapter has no shader-f16")
    x, y = f32(3, 5).astype(np.float16), f32(5).astype(np.float16)
    a, w = f32(2, 4, 6).astype(np.float16), f32(6, 3).astype(np.float16)
    img, k = f32(1, 2, 6, 5).astype(np.float16), f32(3, 2, 3, 3).astype(np.float16)

    def body(b: Builder, n: list[str]) -> list[str]:
        outs = [b.emit(op, [n[0]]) for op in ("exp", "tanh", "erf", "neg")]
        outs += [b.emit(op, [n[0], n[1]]) for op in ("add", "mul", "maximum", "div")]
        outs += [b.emit("gt", [n[0], n[1]]), b.emit("matmul", [n[2], n[3]]),
                 b.emit("reduce_sum", [n[0]], axes=[1]), b.emit("reduce_max", [n[2]], axes=[0]),
                 b.emit("conv2d", [n[4], n[5]], padding=[1, 1, 1, 1]),
                 b.emit("max_pool2d", [n[4]], kernel=2, stride=2),
                 b.emit("cast", [n[0]], dtype="float32"), b.emit("cast", [outs[0]], dtype="int32"),
                 b.emit("raster", [n[1]], shape=[5], regions=[[0, 4, -1, 0, 0, 0, 1, 0, 0, 5, 1, 1]])]
        return outs
    graph, feeds = build([x, y, a, w, img, k], body)
    assert all(UNFUSED.supports(node, graph) for node in graph.nodes)
    check(graph, feeds, rtol=2e-3, atol=2e-3)  # half precision: the checker's float16 tolerance


def test_float16_is_not_claimed_on_an_adapter_without_shader_f16() -> None:
    # f32 otherwise: a real device requested from this adapter without the feature claims no float16 node,
    # so the runtime places them on the next backend; float32 nodes stay on webgpu.
    from edgerun.backends.webgpu.device import GpuDevice

    plain = GpuDevice(get_device().adapter, without={"shader-f16"})
    assert not plain.has_f16

    class WithoutF16(WebGpuBackend):
        @property
        def gpu(self) -> GpuDevice:
            return plain

    x = f32(2, 3)

    def body(b: Builder, n: list[str]) -> list[str]:
        half = b.emit("cast", [b.emit("exp", [n[0]])], dtype="float16")
        return [b.emit("tanh", [b.emit("cast", [b.emit("add", [half, half])], dtype="float32")])]
    graph, feeds = build([x], body)
    backend = WithoutF16()
    claimed = {node.op: backend.supports(node, graph) for node in graph.nodes}
    assert claimed == {"exp": True, "cast": False, "add": False, "tanh": True}
    import edgerun

    loaded = edgerun.load(graph, [backend, "reference"])
    assert [p.backend for p in loaded.parts.partitions] == ["webgpu", "reference", "webgpu"]
    np.testing.assert_allclose(loaded.run(feeds)[0], np.tanh(2 * np.exp(x).astype(np.float16).astype(np.float32)),
                               rtol=2e-3)


def test_unclaimed_dtypes_and_ops() -> None:
    i8 = np.ones((2, 3), np.int8)
    i = np.ones((2, 3), np.int32)
    g8, _ = build([i8, i8], lambda b, n: [b.emit("add", n)])
    gdiv, _ = build([i, i], lambda b, n: [b.emit("div", n)])
    assert not UNFUSED.supports(g8.nodes[0], g8)
    assert not UNFUSED.supports(gdiv.nodes[0], gdiv)


def test_adapter_limits_are_clear_errors() -> None:
    from edgerun.backends.webgpu.device import GpuDevice, _request_adapter

    x = f32(64, 64)
    graph, _feeds = build([x], lambda b, n: [b.emit("exp", n)])
    small = GpuDevice(_request_adapter())
    real = small.limits
    small.limits = replace(real, max_binding_bytes=4096)
    with pytest.raises(EdgerunError, match="maxStorageBufferBindingSize"):
        PartitionRunner(small, graph)
    parts = [f32(2, 2) for _ in range(5)]
    cat, _ = build(parts, lambda b, n: [b.emit("raster", n, shape=[10, 2], regions=[
        [k, 0, 0, 2, 1, 4 * k, 0, 2, 1, 1, 2, 2] for k in range(5)])])
    small.limits = replace(real, max_storage_buffers=4)
    with pytest.raises(EdgerunError, match="maxStorageBuffersPerShaderStage"):
        PartitionRunner(small, cat)
    small.limits = replace(real, max_workgroups=2)
    with pytest.raises(EdgerunError, match="workgroups"):
        PartitionRunner(small, graph)
    small.limits = replace(real, max_workgroup_size=32)
    with pytest.raises(EdgerunError, match="maxComputeWorkgroupSizeX"):
        PartitionRunner(small, graph)
    small.limits = replace(real, max_buffer_bytes=4096)
    with pytest.raises(EdgerunError, match="maxBufferSize"):
        PartitionRunner(small, graph)


def test_kernel_seconds_from_timestamp_queries() -> None:
    x = f32(256, 256)
    def two_dispatches(b: Builder, n: list[str]) -> list[str]:
        t = b.emit("tanh", [b.emit("exp", n)])
        return [t, b.emit("reduce_sum", [t])]  # the sum reads the chain: not merged with it
    graph, feeds = build([x], two_dispatches)
    runner = WebGpuBackend().compile(graph).info["runner"]
    if "timestamp-query" not in runner.gpu.features:
        pytest.skip("this adapter has no timestamp queries")
    seconds = runner.kernel_seconds(feeds)
    assert len(seconds) == len(runner.kernels) == 2  # exp+tanh fused, reduce_sum
    assert all(0 < s < 60 for s in seconds)


@pytest.mark.parametrize(("k", "n", "group", "zero"), [(64, 24, 32, None), (80, 8, 16, "uint8"),
                                                        (96, 16, 64, "float32")])
def test_matmul_int4_matches_the_reference(k: int, n: int, group: int, zero: str | None) -> None:
    # Group-wise int4 weights stay packed on the device (uint8 constants as stored, read as u32 words); K=96
    # with group 64 has a partial last block. An activation matmul + bias + SiLU epilogue fuses onto it.
    blocks = -(-k // group)
    packed = RNG.integers(0, 256, (n, blocks, group // 2)).astype(np.uint8)
    scales = RNG.uniform(0.01, 0.1, (n, blocks)).astype(np.float32)
    zp = {None: None, "uint8": RNG.integers(0, 16, (n, blocks)).astype(np.uint8),
          "float32": RNG.uniform(-2, 10, (n, blocks)).astype(np.float32)}[zero]
    x = f32(2, 3, k)
    bias = f32(n)

    def body(b: Builder, names: list[str]) -> list[str]:
        ins = [names[0], names[1], names[2], *([names[4]] if zp is not None else [])]
        y = b.emit("matmul_int4", ins, k=k, n=n, group_size=group)
        z = b.binary("add", y, names[3])
        return [y, b.binary("mul", z, b.unary("sigmoid", z))]
    values = [x, packed, scales, bias, *([zp] if zp is not None else [])]
    graph, feeds = build(values, body, constant=[False, True, True, True, True])
    assert WebGpuBackend().supports(graph.nodes[0], graph)
    check(graph, feeds, rtol=1e-5, atol=1e-5)
    fused = WebGpuBackend().compile(graph)
    assert [k.label for k in fused.info["runner"].kernels] == ["matmul_int4+add+sigmoid+mul"]
    assert_matches_reference(graph, feeds, fused(*feeds), rtol=1e-5, atol=1e-5)


def test_matmul_int4_with_a_runtime_weight_is_not_claimed() -> None:
    graph, _ = build([f32(1, 32), RNG.integers(0, 256, (4, 1, 16)).astype(np.uint8),
                      np.ones((4, 1), np.float32)],
                     lambda b, n: [b.emit("matmul_int4", n, k=32, n=4, group_size=32)], constant=[False, False, True])
    assert not WebGpuBackend().supports(graph.nodes[0], graph)
    graph, _ = build([f32(1, 32), RNG.integers(0, 256, (4, 1, 16)).astype(np.uint8), np.ones((4, 1), np.float32)],
                     lambda b, n: [b.emit("matmul_int4", n, k=32, n=4, group_size=32, activations="int8")],
                     constant=[False, True, True])
    assert not WebGpuBackend().supports(graph.nodes[0], graph)  # int8-rounded activations: not this kernel


def test_workgroup_argmax_over_a_long_axis_keeps_the_reference_tie_rule() -> None:
    # A decoder's greedy pick: argmax over the vocabulary runs one workgroup per output with a tree reduction;
    # ties (planted far apart, so different threads hold them) resolve like the reference's scan.
    logits = RNG.integers(-50, 50, (3, 5000)).astype(np.float32)
    logits[0, [17, 4100]] = 99.0
    logits[1, [64, 65, 4999]] = -99.0
    cols = f32(2000, 3)

    def body(b: Builder, n: list[str]) -> list[str]:
        return [b.emit("argmax", [n[0]], axis=1), b.emit("argmin", [n[0]], axis=1),
                b.emit("argmax", [n[0]], axis=1, select_last_index=True),
                b.emit("argmin", [n[0]], axis=1, select_last_index=True), b.emit("argmax", [n[1]], axis=0)]
    graph, feeds = build([logits, cols], body)
    compiled = WebGpuBackend().compile(graph)
    assert {k.label for k in compiled.info["runner"].kernels} == {"argmax:workgroup", "argmin:workgroup"}
    got = compiled(*feeds)
    assert_matches_reference(graph, feeds, got)
    assert got[0][0] == 17 and got[2][0] == 4100 and got[1][1] == 64 and got[3][1] == 4999


def test_softmax_and_rms_norm_run_whole_in_one_dispatch_each() -> None:
    x, w = f32(3, 5, 7), f32(7)

    def body(b: Builder, n: list[str]) -> list[str]:
        return [b.emit("softmax", [n[0]], axis=1), b.emit("softmax", [n[0]], axis=-1),
                b.emit("rms_norm", [n[0], n[1]], eps=1e-5), b.emit("rms_norm", [n[0]], eps=1e-6)]
    graph, feeds = build([x, w], body, constant=[False, True])
    backend = WebGpuBackend()
    assert all(backend.keeps_whole(node, graph) for node in graph.nodes)
    compiled = backend.compile(graph)
    # Each whole; independent of each other, so they also share one dispatch (horizontal fusion).
    assert [k.label for k in compiled.info["runner"].kernels] == ["softmax & softmax & rms_norm & rms_norm"]
    assert_matches_reference(decomposed(graph), feeds, compiled(*feeds), rtol=1e-6, atol=1e-6)
    graph2, _ = build([f32(2, 3, 4), f32(3, 4)], lambda b, n: [b.emit("rms_norm", n, normalized_ndim=2)],
                      constant=[False, True])
    assert not backend.keeps_whole(graph2.nodes[0], graph2)  # two normalized axes: decomposed


def test_layer_norm_runs_whole_in_one_dispatch() -> None:
    # LayerNorm (MiniLM's, ViT's) whole: one thread per element recomputing its row's mean and variance in the
    # decomposition's order, against the 2-3 dispatches of its decomposition; weight and bias optional, as
    # constants or inputs. Not over two axes (normalized_ndim 2): that one is decomposed.
    x, w, bias = f32(4, 3, 24), f32(24), f32(24)

    def body(b: Builder, n: list[str]) -> list[str]:
        return [b.emit("layer_norm", [n[0], n[1], n[2]], eps=1e-5), b.emit("layer_norm", [n[0]], eps=1e-6),
                b.emit("layer_norm", [n[0], "", n[3]], eps=1e-5), b.emit("layer_norm", [n[0], n[3]], eps=1e-12)]
    graph, feeds = build([x, w, bias, f32(24)], body, constant=[False, True, True, False])
    backend = WebGpuBackend()
    assert all(backend.keeps_whole(node, graph) for node in graph.nodes)
    compiled = backend.compile(graph)
    assert [k.label for k in compiled.info["runner"].kernels] == ["layer_norm & layer_norm & layer_norm & layer_norm"]
    got = compiled(*feeds)
    assert_matches_reference(decomposed(graph), feeds, got, rtol=1e-5, atol=1e-6)
    unfused = WebGpuBackend(fuse=False).compile(decomposed(graph))
    assert len(unfused.info["runner"].kernels) > 4 * 2
    two_axes, _ = build([x], lambda b, n: [b.emit("layer_norm", [n[0]], normalized_ndim=2)])
    assert not backend.keeps_whole(two_axes.nodes[0], two_axes)


@pytest.mark.parametrize("int4", [False, True])
def test_gate_up_silu_is_one_dispatch(int4: bool) -> None:
    # A decoder's MLP: silu(h @ Wg) * (h @ Wu), then the down projection. The up matmul shares the gate's input
    # and rides in its dispatch (two dot products per thread), so gate + up + SiLU + mul is one dispatch.
    h = f32(2, 32)

    def weight(b: Builder) -> list[str]:
        if not int4:
            return [b.const(f32(32, 48, low=-0.3, high=0.3))]
        return [b.const(RNG.integers(0, 256, (48, 1, 16)).astype(np.uint8)),
                b.const(RNG.uniform(0.01, 0.05, (48, 1)).astype(np.float32))]

    def body(b: Builder, n: list[str]) -> list[str]:
        mm = "matmul_int4" if int4 else "matmul"
        attrs = {"k": 32, "n": 48, "group_size": 32} if int4 else {}
        gate = b.emit(mm, [n[0], *weight(b)], **attrs)
        gated = b.binary("mul", gate, b.unary("sigmoid", gate))
        up = b.emit(mm, [n[0], *weight(b)], **attrs)
        return [b.emit("matmul", [b.binary("mul", gated, up), b.const(f32(48, 32))])]
    graph, feeds = build([h], body)
    compiled = WebGpuBackend().compile(graph)
    mm = "matmul_int4" if int4 else "matmul"
    assert [k.label for k in compiled.info["runner"].kernels] == [f"{mm}|{mm}+sigmoid+mul+mul", "matmul"]
    assert_matches_reference(graph, feeds, compiled(*feeds), rtol=1e-5, atol=1e-5)


def test_rope_rasters_are_computed_where_they_are_read() -> None:
    # x * cos + rotate_half(x) * sin: the two slices, the neg and the concat (rasters and an elementwise op
    # between them) are not dispatched; the multiply-add reads them through WGSL functions, one dispatch.
    x, cos, sin = f32(4, 1, 8), f32(1, 8), f32(1, 8)

    def body(b: Builder, n: list[str]) -> list[str]:
        x1 = b.emit("slice", [n[0]], starts=[0], ends=[4], axes=[2])
        x2 = b.emit("slice", [n[0]], starts=[4], ends=[8], axes=[2])
        rotated = b.emit("concat", [b.unary("neg", x2), x1], axis=2)
        return [b.binary("add", b.binary("mul", n[0], n[1]), b.binary("mul", rotated, n[2]))]
    graph, feeds = build([x, cos, sin], body)
    graph = decomposed(graph)
    compiled = WebGpuBackend().compile(graph)
    assert [k.label for k in compiled.info["runner"].kernels] == ["mul+mul+add"]
    assert_matches_reference(graph, feeds, compiled(*feeds), rtol=0, atol=0)
    assert len(WebGpuBackend(fuse=False).compile(graph).info["runner"].kernels) == 7


def test_rasters_inline_into_matmul_and_softmax_but_not_when_read_twice() -> None:
    # Attention's shapes: a transposed operand read by a matmul, a concat read by a softmax, both computed in
    # the reader's loads; a raster read twice stays a dispatch of its own.
    x, y = f32(3, 8), f32(3, 5)

    def body(b: Builder, n: list[str]) -> list[str]:
        t = b.emit("transpose", [n[0]], perm=[1, 0])
        twice = b.emit("transpose", [n[1]], perm=[1, 0])
        scores = b.emit("concat", [n[0], n[1]], axis=1)
        return [b.emit("matmul", [t, n[0]]), b.emit("softmax", [scores], axis=1), b.binary("add", twice, twice)]
    graph, feeds = build([x, y], body)
    graph = decomposed(graph, keep=WebGpuBackend().keeps_whole)
    compiled = WebGpuBackend().compile(graph)
    # The raster read twice is its own copy; then matmul, softmax and the add are independent: one dispatch.
    assert [k.label for k in compiled.info["runner"].kernels] == ["raster_1:copy", "matmul & softmax & add"]
    assert_matches_reference(decomposed(graph), feeds, compiled(*feeds), rtol=1e-4, atol=1e-5)  # BLAS sums in another order


def int4_graph(k: int = 512, n: int = 48, group: int = 32) -> tuple[Graph, list[np.ndarray]]:
    blocks = k // group
    packed = RNG.integers(0, 256, (n, blocks, group // 2)).astype(np.uint8)
    scales = RNG.uniform(0.01, 0.1, (n, blocks)).astype(np.float32)
    zero = RNG.uniform(0, 15, (n, blocks)).astype(np.float32)  # Q4_1's -m/d
    return build([f32(3, k), packed, scales, zero],
                 lambda b, names: [b.emit("matmul_int4", names, k=k, n=n, group_size=group)],
                 constant=[False, True, True, True])


def test_matmul_int4_accumulates_in_f16_where_the_adapter_has_shader_f16() -> None:
    # f16 accumulation: weight and activation rounded to f16, summed in f16 over each group of 32, groups
    # added in f32. Tolerance: 1e-3 of sum(|a * w|) per output; measured 2e-4 at K=512 and 1e-4 at K=2048 (the
    # worst case for a group of g in f16 is about (g + 2) * 2^-11 = 1.7e-2 of it; rounding errors mostly cancel).
    graph, feeds = int4_graph()
    if not get_device().has_f16:
        pytest.skip("this adapter has no shader-f16 (the fallback test below covers it)")
    half = WebGpuBackend(int4_accumulate="f16").compile(graph)
    full = WebGpuBackend().compile(graph)
    assert (half.info["int4_accumulate"], full.info["int4_accumulate"]) == ("f16", "f32")
    assert "enable f16" in half.info["runner"].kernels[0].source
    assert "enable f16" not in full.info["runner"].kernels[0].source
    got, want = half(*feeds)[0], full(*feeds)[0]
    assert_matches_reference(graph, feeds, [want], rtol=1e-5, atol=1e-5)
    x, packed, scales, zero = feeds[0], *(graph.constants[v] for v in graph.nodes[0].inputs[1:])
    q = np.stack([packed & 15, packed >> 4], axis=-1).reshape(packed.shape[0], -1).astype(np.float32)
    w = (q - np.repeat(zero, 32, axis=1)) * np.repeat(scales, 32, axis=1)  # [n, k]
    scale = np.abs(x) @ np.abs(w).T
    assert np.all(np.abs(got - want) <= 1e-3 * scale)
    assert not np.array_equal(got, want)  # it really summed in f16


def test_matmul_int4_f16_request_falls_back_to_f32_without_shader_f16() -> None:
    # A device without shader-f16 (this adapter's, with the feature not requested): the f16 request compiles
    # the f32 kernel, bit for bit the default's outputs.
    from edgerun.backends.webgpu.device import GpuDevice

    graph, feeds = int4_graph()
    plain = GpuDevice(get_device().adapter, without={"shader-f16"})
    assert not plain.has_f16
    runner = PartitionRunner(plain, graph, int4_accumulate="f16")
    assert runner.int4_accumulate == "f32" and all("enable f16" not in k.source for k in runner.kernels)
    out = [np.empty((3, 48), np.float32)]
    runner.run(feeds, out)
    want = WebGpuBackend().compile(graph)(*feeds)[0]
    assert np.array_equal(out[0].view(np.uint32), want.view(np.uint32))
    with pytest.raises(EdgerunError, match="int4_accumulate"):
        WebGpuBackend(int4_accumulate="f8")


def test_independent_groups_share_a_dispatch_within_the_binding_limit() -> None:
    # A decoder's q and k projections (one input, different widths) are one dispatch, each over its own
    # threads; the sums read them, so they are not merged with them, and the add (in k's sum's epilogue)
    # reads q's sum, so the two sums stay apart too. Merging changes no thread's arithmetic: the outputs
    # equal the unmerged dispatches' bit for bit.
    h = f32(2, 32)

    def body(b: Builder, n: list[str]) -> list[str]:
        q = b.emit("matmul", [n[0], b.const(f32(32, 48))])
        k = b.emit("matmul", [n[0], b.const(f32(32, 16))])
        return [q, k, b.binary("add", b.emit("reduce_sum", [q], axes=[1], keepdims=True),
                               b.emit("reduce_sum", [k], axes=[1], keepdims=True))]
    graph, feeds = build([h], body)
    compiled = WebGpuBackend().compile(graph)
    runner = compiled.info["runner"]
    assert [k.label for k in runner.kernels] == ["matmul & matmul", "reduce_sum", "reduce_sum+add"]
    merged = compiled(*feeds)
    assert_matches_reference(graph, feeds, merged, rtol=1e-5, atol=1e-5)
    runner.set_fusion(True, max_bindings=4)  # q's 3 bindings + k's 2 more: over the limit, so not merged
    assert [k.label for k in runner.kernels] == ["matmul", "matmul", "reduce_sum", "reduce_sum+add"]
    for a, b in zip(merged, compiled(*feeds)):
        assert np.array_equal(a, b)


def test_an_elementwise_node_joins_an_earlier_group_and_matmuls_pair_as_siblings() -> None:
    # RoPE's q scale comes after RoPE of k, yet rides in RoPE q's dispatch (everything else it reads exists
    # before that dispatch). Attention's p_cache @ v_cache + p_new @ v_new: two matmuls of one output shape,
    # neither operand made by the group, computed by one thread each and added in the same dispatch.
    q, k, p1, v1, p2, v2 = f32(4, 8), f32(2, 8), f32(3, 16), f32(16, 8), f32(3, 1), f32(1, 8)

    def body(b: Builder, n: list[str]) -> list[str]:
        rq = b.binary("mul", n[0], n[0])
        rk = b.binary("mul", n[1], n[1])
        scaled = b.binary("mul", rq, b.const(np.float32(0.125)))
        out = b.binary("add", b.emit("matmul", [n[2], n[3]]), b.emit("matmul", [n[4], n[5]]))
        return [scaled, rk, out]
    graph, feeds = build([q, k, p1, v1, p2, v2], body)
    compiled = WebGpuBackend().compile(graph)
    assert [k.label for k in compiled.info["runner"].kernels] == ["mul+mul & mul & matmul|matmul+add"]
    assert_matches_reference(graph, feeds, compiled(*feeds), rtol=1e-5, atol=1e-5)  # BLAS sums in another order


def test_rms_norm_read_only_by_matmuls_runs_in_their_prologue() -> None:
    # A decoder's attention/MLP norm feeds only projections: each projection thread sums its row's squares
    # and reads (x * inv) * weight itself, so the norm takes no dispatch (dense and int4, and a sibling pair).
    # A norm that something else also reads stays a dispatch of its own.
    x = f32(2, 64)

    def body(b: Builder, n: list[str]) -> list[str]:
        h = b.emit("rms_norm", [n[0], b.const(f32(64))], eps=1e-5)
        q = b.emit("matmul", [h, b.const(f32(64, 32, low=-0.2, high=0.2))])
        packed = [b.const(RNG.integers(0, 256, (16, 2, 16)).astype(np.uint8)),
                  b.const(RNG.uniform(0.01, 0.05, (16, 2)).astype(np.float32))]
        k = b.emit("matmul_int4", [h, *packed], k=64, n=16, group_size=32)
        g = b.emit("rms_norm", [n[0], b.const(f32(64))], eps=1e-6)
        gate, up = (b.emit("matmul", [g, b.const(f32(64, 24, low=-0.2, high=0.2))]) for _ in range(2))
        kept = b.emit("rms_norm", [n[0], b.const(f32(64))], eps=1e-6)
        return [q, k, b.binary("mul", gate, up), b.emit("matmul", [kept, b.const(f32(64, 8))]),
                b.unary("exp", kept)]
    graph, feeds = build([x], body)
    compiled = WebGpuBackend().compile(graph)
    labels = " & ".join(k.label for k in compiled.info["runner"].kernels).split(" & ")
    assert [label for label in labels if "rms_norm" in label] == ["rms_norm+exp"]  # only `kept` is dispatched
    assert {"matmul", "matmul_int4", "matmul|matmul+mul"} <= set(labels)
    assert_matches_reference(decomposed(graph), feeds, compiled(*feeds), rtol=1e-5, atol=1e-5)
    unfused = WebGpuBackend(fuse=False).compile(graph)(*feeds)
    for a, b in zip(compiled(*feeds), unfused):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


def _decoder_tail_with_kv_append(read_after: bool) -> tuple[Graph, list[np.ndarray]]:
    # A decode step's end of layer: the new key row (a projection, reshaped to the cache's [kv, hd, 1]), the
    # scores against the cache (its last read), the output projection + residual, then the append
    # update_slice(cache, row, start) along the cache's position axis. `read_after`: a reduction of the cache
    # comes after the append, so writing in place would be wrong.
    x, cache, start = f32(1, 8), f32(2, 4, 6), np.array([3], np.int64)

    def body(b: Builder, n: list[str]) -> list[str]:
        row = b.emit("reshape", [b.emit("matmul", [n[0], b.const(f32(8, 8))])], shape=[2, 4, 1])
        scores = b.emit("reshape", [b.emit("matmul", [b.const(f32(2, 1, 4)), n[1]])], shape=[1, 12])
        out = b.binary("add", b.emit("matmul", [scores, b.const(f32(12, 8))]), n[0])
        appended = b.emit("update_slice", [n[1], row, n[2]], axis=2)
        return [out, appended, *([b.emit("reduce_sum", [n[1]], axes=[2])] if read_after else [])]
    graph, feeds = build([x, cache, start], body)
    return decomposed(graph), feeds


@pytest.mark.parametrize("start", [0, 3, 5, 9, -2])  # 9 and -2: clamped so the row fits, as the reference does
def test_kv_append_writes_in_place_and_shares_a_dispatch(start: int) -> None:
    # The append takes no dispatch of its own: its output shares the cache's device range, one thread per new
    # element writes it at `start`, in the first dispatch after the scores (the cache's last reader), beside
    # the output projection (horizontal fusion: neither reads what the other writes). Bit for bit the
    # out-of-place kernel's cache (unfused: one thread per cache element).
    graph, feeds = _decoder_tail_with_kv_append(read_after=False)
    feeds[2] = np.array([start], np.int64)
    compiled = WebGpuBackend().compile(graph)
    runner = compiled.info["runner"]
    assert [k.label for k in runner.kernels] == ["matmul & matmul", "update_slice & matmul+add"]
    assert runner.value_range(graph.outputs[1]) == runner.value_range(graph.inputs[1])  # in place
    fused = compiled(*feeds)
    unfused = UNFUSED.compile(graph)
    assert len(unfused.info["runner"].kernels) == 7
    for a, b in zip(fused, unfused(*feeds)):
        assert np.array_equal(a, b)
    assert_matches_reference(graph, feeds, fused, rtol=1e-5, atol=1e-5)
    want = feeds[1].copy()
    want[:, :, min(max(start, 0), 5)] = fused[1][:, :, min(max(start, 0), 5)]
    assert np.array_equal(fused[1], want)  # every other column is the cache as it came in
    for _ in range(3):  # replayed calls write the same rows
        for a, b in zip(fused, compiled(*feeds)):
            assert np.array_equal(a, b)
    assert runner.stats.replays == 3


def test_kv_append_read_after_stays_out_of_place() -> None:
    # A reader of the cache after the append must see the old cache: the append gets its own out-of-place
    # dispatch (a copy with the row in), and the reduction reads the untouched input range.
    graph, feeds = _decoder_tail_with_kv_append(read_after=True)
    compiled = WebGpuBackend().compile(graph)
    runner = compiled.info["runner"]
    assert any("update_slice" in k.label for k in runner.kernels)
    assert runner.value_range(graph.outputs[1]) != runner.value_range(graph.inputs[1])
    assert_matches_reference(graph, feeds, compiled(*feeds), rtol=1e-5, atol=1e-5)


def cache_attention_graph(layout: str = "heads", window: int = 0, softcap: float = 0.0, rotary: int = 16,
                          read_after: bool = False, **attrs: Any) -> tuple[Graph, list[np.ndarray]]:
    """One `cache_attention` (6 query heads over 2 kv heads, head dim 80: more dims than a workgroup has
    threads; 3 new rows; a cache of 100 cells: more than one tile of keys) at start 37, with rotary tables
    turning the first `rotary` dims (0: none). `read_after`: the key cache is read again after the op."""
    t, c, heads, kv, hd = 3, 100, 6, 2, 80
    q, k, v = f32(t, heads * hd), f32(t, kv * hd), f32(t, kv * hd)
    k_cache, v_cache = (f32(1, kv, c, hd), f32(1, kv, c, hd)) if layout == "heads" else (f32(kv, hd, c), f32(kv, c, hd))
    angles = np.arange(128, dtype=np.float32)[:, None] * RNG.uniform(0.01, 0.5, max(rotary // 2, 1)).astype(np.float32)
    tables = [np.concatenate([f(angles)] * 2, axis=1).astype(np.float32) for f in (np.cos, np.sin)] if rotary else []

    def body(b: Builder, n: list[str]) -> list[str]:
        ins = [*n[:6], *(b.const(x) for x in tables)]
        outs = b.emit_multi("cache_attention", ins, head_dim=hd, layout=layout, window=window, softcap=softcap,
                            scale=0.11, **attrs)
        return [*outs, b.emit("reduce_sum", [n[3]], axes=[0])] if read_after else outs
    return build([q, k, v, k_cache, v_cache, np.array([37], np.int64)], body)


@pytest.mark.parametrize(("layout", "window", "softcap", "rotary"),
                         [("heads", 0, 0.0, 80), ("heads", 20, 0.0, 32), ("keys_transposed", 0, 5.0, 80),
                          ("keys_transposed", 39, 2.0, 0)])
def test_cache_attention_is_one_dispatch_appending_in_place(layout: str, window: int, softcap: float,
                                                            rotary: int) -> None:
    # The op claimed whole: one workgroup kernel computes the rotary, scores, window, soft-cap, softmax and
    # values; the rotated keys and the values are appended into the caches' own ranges by two parts that
    # float into the next dispatch (here nothing follows: they share one). Output within f32 tolerance of
    # the reference (the sums run in another order), both caches bit for bit; replayed at other starts: the
    # cache filled to its end, a start past it (the rows written at the end, as update_slice clamps them,
    # after the attention read the old cells) and a negative one.
    graph, feeds = cache_attention_graph(layout, window, softcap, rotary)
    compiled = WebGpuBackend().compile(graph)
    runner = compiled.info["runner"]
    assert [k.label for k in runner.kernels] == ["cache_attention:workgroup",
                                                 "cache_attention:append & cache_attention:append"]
    assert runner.value_range(graph.outputs[1]) == runner.value_range(graph.inputs[3])  # in place
    assert runner.value_range(graph.outputs[2]) == runner.value_range(graph.inputs[4])
    for start in (37, 0, 1, 97, 99, -2):
        feeds[5] = np.array([start], np.int64)
        got, want = compiled(*feeds), interpret(graph, feeds)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-4, atol=1e-5)
        assert np.array_equal(got[1], want[1]) and np.array_equal(got[2], want[2]), start
    assert runner.stats.replays == 5


def test_cache_attention_reads_only_the_cells_it_may_see() -> None:
    # Cells at or past `start` and keys outside the window are never read: NaN there leaves the output bit for
    # bit the output with zeros there, where the decomposition (0 x NaN in the value product) gives NaN.
    graph, feeds = cache_attention_graph(window=20)
    compiled = WebGpuBackend().compile(graph)
    clean, poisoned = list(feeds), list(feeds)
    for target, fill in ((clean, 0.0), (poisoned, np.nan)):
        target[3], target[4] = target[3].copy(), target[4].copy()
        for cache in target[3:5]:
            cache[:, :, 37:] = fill  # the cells from start on
            cache[:, :, :37 - 19] = fill  # before the first row's window (position 37 sees 18 .. 37)
    got = compiled(*clean)
    np.testing.assert_allclose(got[0], interpret(graph, clean)[0], rtol=1e-4, atol=1e-5)
    assert np.array_equal(compiled(*poisoned)[0].view(np.uint32), got[0].view(np.uint32))
    assert np.isnan(interpret(graph, poisoned)[0]).all()


def test_cache_attention_with_a_cache_read_after_copies_the_caches() -> None:
    # A cache read after the op is not updated in place: both caches are copied to the updated values'
    # ranges first, the appends write there, and the reader sees the old cache.
    graph, feeds = cache_attention_graph(read_after=True)
    compiled = WebGpuBackend().compile(graph)
    runner = compiled.info["runner"]
    assert [k.label for k in runner.kernels][:2] == ["cache_attention:copy", "cache_attention:workgroup"]
    assert runner.value_range(graph.outputs[1]) != runner.value_range(graph.inputs[3])
    for got, want in zip(compiled(*feeds), interpret(graph, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def batched_cache_attention_graph() -> tuple[Graph, list[np.ndarray]]:
    """A batched decode's cache_attention: 2 sequences, one row each, at their own starts."""
    kv, c, hd = 2, 40, 16
    feeds = [f32(2, 4 * hd), f32(2, kv * hd), f32(2, kv * hd), f32(2, kv, c, hd), f32(2, kv, c, hd),
             np.array([5, 17], np.int64)]
    return build(feeds, lambda b, n: b.emit_multi("cache_attention", n, head_dim=hd, layout="heads"))


@pytest.mark.parametrize("case", ["unknown attribute", "two sequences"])
def test_cache_attention_with_what_the_kernel_does_not_know_runs_its_decomposition(case: str) -> None:
    # What the kernel was not written for (an attribute it does not read; a batched decode's per-sequence
    # starts) is not claimed: the runtime places the op's decomposition on webgpu instead of computing
    # something else.
    from edgerun.runtime import load

    graph, feeds = cache_attention_graph(lengths_per_sequence=True) if case == "unknown attribute" \
        else batched_cache_attention_graph()
    node = next(n for n in graph.nodes if n.op == "cache_attention")
    assert not WebGpuBackend().keeps_whole(node, graph)
    plain, _ = cache_attention_graph()
    assert WebGpuBackend().keeps_whole(next(n for n in plain.nodes if n.op == "cache_attention"), plain)
    program = load(graph, backends=["webgpu"])
    assert {p.backend for p in program.partitions} == {"webgpu"}
    assert not any(n.op == "cache_attention" for p in program.partitions for n in p.nodes)
    want = interpret(graph, feeds)
    for a, b in zip(program(*feeds), want):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_scatter_add_sums_repeated_indices_in_order_and_checks_its_range() -> None:
    data, updates = f32(5, 3, 2), f32(5, 4, 2)
    idx = np.array([2, -1, 2, 0], np.int64)  # a repeated index accumulates, a negative one wraps
    graph, _ = build([data, idx, updates], lambda b, n: [b.emit("scatter_add", [n[0], n[1], n[2]], axis=1)])
    part = UNFUSED.compile(graph)
    np.testing.assert_array_equal(part(data, idx, updates)[0], interpret(graph, [data, idx, updates])[0])  # bit for bit
    rows = f32(6, 4)
    graph, _ = build([rows, idx, f32(4, 4)], lambda b, n: [b.emit("exp", [b.emit("scatter_add", n, axis=0)])])
    check(graph, [rows, idx, f32(4, 4)])
    with pytest.raises(EdgerunError, match="scatter_add index out of range"):
        UNFUSED.compile(graph)(rows, np.array([0, 6, 1, 1], np.int64), f32(4, 4))
