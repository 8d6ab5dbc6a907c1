"""The webgpu backend's int8/uint8 storage and quantized kernels (edgerun/backends/webgpu/int8.py) against the
oracle's exact kernels on lavapipe: integer results bit for bit (ties, saturation, per-tensor and per-channel
parameters, int8 and uint8, sizes that end mid-word), dequantize within float32 rounding, and quantized
programs placed whole on webgpu with the reference backend's outputs."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("wgpu")

from backends_testkit import assert_matches_reference, graph_inputs
from small_cnn import small_cnn

import edgerun
from edgerun.errors import BackendUnavailableError, EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec

try:
    from edgerun.backends.webgpu import WebGpuBackend, get_device

    get_device()
except BackendUnavailableError as exc:  # pragma: no cover - CI installs lavapipe
    pytest.skip(f"no WebGPU adapter: {exc}", allow_module_level=True)


RNG = np.random.default_rng(7)
BACKEND = WebGpuBackend()
Q_TYPES = (np.int8, np.uint8)


def one_node_graph(op: str, inputs: Sequence[Any], constant: Sequence[bool] = (), **attrs: Any) -> Graph:
    """A graph of one `op` node with all its outputs; inputs flagged in `constant` become constants."""
    g = Graph()
    names = [g.add_constant(np.asarray(v)) if k < len(constant) and constant[k]
             else g.add_input(f"in{k}", TensorSpec(np.shape(v), DType.of(v))) for k, v in enumerate(inputs)]
    g.outputs = Builder(g).emit_multi(op, names, **attrs)
    return g


def run_one(op: str, values: Sequence[Any], constant: Sequence[bool] = (), **attrs: Any) -> list[np.ndarray]:
    """One `op` node on webgpu, checked against the oracle (integers exactly, floats within f32 rounding)."""
    graph = one_node_graph(op, values, constant, **attrs)
    assert BACKEND.supports(graph.nodes[0], graph), op
    feeds = graph_inputs(graph, values, constant)
    got = BACKEND.compile(graph)(*feeds)
    assert_matches_reference(graph, feeds, got, rtol=1e-7, atol=0.0)
    return got


def full_range(dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    return RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)


@pytest.mark.parametrize("dtype", Q_TYPES)
def test_quantize_linear_ties_saturation_and_per_channel(dtype: type) -> None:
    # ties at x / scale = k + 0.5 (scale 0.5: exact quotients), both signs; saturation both ways; NaN -> zero
    # point, +-inf saturate; 2 * 3 * 7 = 42 elements: the last word holds 2
    x = RNG.uniform(-40, 40, (2, 3, 7)).astype(np.float32)
    x[0, 0] = [0.25, 0.75, 1.25, -0.25, -0.75, -1.25, 1.75]
    x[0, 1, :4] = [1e6, -1e6, np.inf, -np.inf]
    x[0, 1, 4] = np.nan
    zp = dtype(3) if dtype is np.int8 else dtype(128)
    got = run_one("quantize_linear", [x, np.float32(0.5), zp], [False, True, True])[0]
    assert got[0, 0].tolist() == [int(zp) + d for d in (0, 2, 2, 0, -2, -2, 4)]  # half to even
    info = np.iinfo(dtype)
    assert got[0, 1, :5].tolist() == [info.max, info.min, info.max, info.min, int(zp)]
    # per channel of NCHW-like [C, 1] and per channel zero points, runtime (not constant) parameters
    scale = RNG.uniform(0.05, 0.3, (3, 1)).astype(np.float32)
    zps = full_range(dtype, (3, 1))
    run_one("quantize_linear", [x, scale, zps])


@pytest.mark.parametrize("dtype", [*Q_TYPES, np.int32])
def test_dequantize_linear_per_tensor_and_per_channel(dtype: type) -> None:
    q = full_range(dtype, (2, 5, 3))
    if dtype is np.int32:  # an int32 accumulator: zero point 0 (claimed only as a constant of zeros)
        run_one("dequantize_linear", [q, RNG.uniform(0.001, 1, (5, 1)).astype(np.float32), np.int32(0)],
                [False, False, True])
        graph = one_node_graph("dequantize_linear", [q, np.float32(1), np.int32(5)], [False, True, True])
        assert not BACKEND.supports(graph.nodes[0], graph)  # q - 5 could wrap in i32: left to the reference
        return
    run_one("dequantize_linear", [q, np.float32(0.02), full_range(dtype, ())], [False, True, True])
    run_one("dequantize_linear", [q, RNG.uniform(0.001, 1, (5, 1)).astype(np.float32), full_range(dtype, (5, 1))])


@pytest.mark.parametrize("arithmetic", ["exact", "float32"])
@pytest.mark.parametrize("dtype", Q_TYPES)
def test_requantize_exact_and_float32_at_ties_and_extremes(arithmetic: str, dtype: type) -> None:
    i32 = np.iinfo(np.int32)
    acc = RNG.integers(-200_000, 200_000, (4, 3, 5)).astype(np.int32)
    acc[0, 0] = [i32.max, i32.min, i32.min + 1, 0, -1]
    acc[0, 1] = [1, 3, 5, -3, -5]  # with scale 0.5: 0.5, 1.5, 2.5, -1.5, -2.5, ties both ways
    acc[0, 2] = [127, 255, 383, -255, 2 ** 24 + 1]
    zp = dtype(-5) if dtype is np.int8 else dtype(100)
    for scale in (np.float32(0.5), np.float32(2.0 ** -20), np.float32(3e-4), np.float32(1.0),
                  np.float32(2.0 ** 24), np.float32(1e-40) if arithmetic == "float32" else np.float32(2.0 ** -40)):
        got = run_one("requantize", [acc, scale, zp], [False, True, True], arithmetic=arithmetic)[0]
        if scale == np.float32(0.5):
            assert got[0, 1].tolist() == [int(zp) + d for d in (0, 2, 2, -2, -2)]
    # per channel scales (odd mantissas: the exact form's 64-bit product matters) and zero points
    scales = RNG.uniform(1e-5, 1e-2, (3, 1)).astype(np.float32)
    run_one("requantize", [acc, scales, full_range(dtype, (3, 1))], [False, True, False], arithmetic=arithmetic)
    # the exact form rounds acc * scale, not float32(acc) * scale: the two differ for large accumulators
    big = (np.arange(-60, 60, dtype=np.int64) * 37_000_001 % (2 ** 31 - 1)).astype(np.int32)
    run_one("requantize", [big, np.float32(1.7e-7), dtype(0)], [False, True, True], arithmetic=arithmetic)


def test_requantize_exact_claims_only_constant_finite_scales() -> None:
    acc = np.arange(6, dtype=np.int32)
    runtime = one_node_graph("requantize", [acc, np.float32(0.1), np.int8(0)], [False, False, True])
    infinite = one_node_graph("requantize", [acc, np.float32(np.inf), np.int8(0)], [False, True, True])
    assert not BACKEND.supports(runtime.nodes[0], runtime)  # the oracle raises on a non-finite scale
    assert not BACKEND.supports(infinite.nodes[0], infinite)


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_dynamic_quantize_per_tensor_and_per_token(per_token: bool, dtype: str) -> None:
    x = RNG.standard_normal((5, 2, 9)).astype(np.float32) * 3
    x[1, 0] = 0.0  # an all-zero row: scale 1
    x[2, 1] = np.abs(x[2, 1]) + 1  # all positive: the range still includes 0
    _, scale, zp = run_one("dynamic_quantize", [x], per_token=per_token, dtype=dtype)
    assert scale.shape == ((5, 2, 1) if per_token else ())
    if per_token:  # the all-zero row: scale 1, zero point at the bottom of the range
        assert scale[1, 0, 0] == 1 and zp[1, 0, 0] == np.iinfo(dtype).min
    bad = x.copy()
    bad[3, 1, 4] = np.nan
    graph = one_node_graph("dynamic_quantize", [bad], per_token=per_token, dtype=dtype)
    with pytest.raises(EdgerunError, match="dynamic_quantize input has NaN or infinity"):
        BACKEND.compile(graph)(bad)


@pytest.mark.parametrize("a_dtype,b_dtype", [(np.int8, np.int8), (np.uint8, np.int8), (np.uint8, np.uint8)])
def test_matmul_integer_full_range_zero_points_per_row_and_column(a_dtype: type, b_dtype: type) -> None:
    a = full_range(a_dtype, (2, 5, 37))
    b = full_range(b_dtype, (37, 6))
    info_a, info_b = np.iinfo(a_dtype), np.iinfo(b_dtype)
    a[0, 0] = info_a.max  # with zero points at the other end: |shifted| reaches 255
    b[:, 0] = info_b.min
    run_one("matmul_integer", [a, b, a_dtype(info_a.min), b_dtype(info_b.max)], [False, True, True, True])
    # a's zero point per row, b's per column, runtime values; batch broadcast of b
    b3 = full_range(b_dtype, (1, 37, 6))
    run_one("matmul_integer", [a, b3, full_range(a_dtype, (5, 1)), full_range(b_dtype, (6,))])


def test_matmul_integer_wraps_like_int32() -> None:
    a = np.full((1, 3000), 255, np.uint8)  # 3000 * 255 * 255 = 195 075 000 ... times 11 columns summed
    b = np.full((3000, 2), 255, np.uint8)
    a2 = np.concatenate([a] * 12, axis=1)
    b2 = np.concatenate([b] * 12, axis=0)  # K = 36000: 36000 * 65025 > 2^31, the int32 sum wraps
    got = run_one("matmul_integer", [a2, b2, np.uint8(0), np.uint8(0)], [False, True, True, True])[0]
    assert got[0, 0] == np.int64(36000 * 65025 - 2 ** 32)


@pytest.mark.parametrize("attrs", [
    {"padding": [1, 1, 1, 1]},
    {"padding": [0, 2, 1, 0], "stride": [2, 2], "dilation": [1, 2]},
    {"padding": [1, 1, 1, 1], "groups": 2},
])
@pytest.mark.parametrize("x_dtype", Q_TYPES)
def test_conv_integer_stride_padding_dilation_groups_per_channel(attrs: dict[str, Any], x_dtype: type) -> None:
    x = full_range(x_dtype, (2, 4, 7, 6))
    groups = attrs.get("groups", 1)
    w = full_range(np.int8, (6, 4 // groups, 3, 3))
    xz = x_dtype(7) if x_dtype is np.int8 else x_dtype(200)  # a real zero padding: not x_zp
    run_one("conv_integer", [x, w, xz, np.int8(-3)], [False, True, True, True], **attrs)
    run_one("conv_integer", [x, w, xz, full_range(np.int8, (6, 1, 1, 1))], [False, True, False, True], **attrs)


def test_int8_values_cross_to_and_from_the_host_packed_and_aligned() -> None:
    """int8 and uint8 inputs and outputs of odd sizes go through the arena (offsets 4-byte aligned, words not
    shared), and a chain of kernels passes packed bytes on: quantize -> requantize-free round trips."""
    g = Graph()
    b = Builder(g)
    qa = g.add_input("qa", TensorSpec((3, 5), DType.int8))
    qb = g.add_input("qb", TensorSpec((7,), DType.uint8))
    fa = b.emit("dequantize_linear", [qa, g.add_constant(np.float32(0.5)), g.add_constant(np.int8(-1))])
    ra = b.emit("quantize_linear", [fa, g.add_constant(np.float32(0.25)), g.add_constant(np.int8(1))])
    fb = b.emit("dequantize_linear", [qb, g.add_constant(np.float32(1.0)), g.add_constant(np.uint8(9))])
    rb = b.emit("quantize_linear", [fb, g.add_constant(np.float32(3.0)), g.add_constant(np.uint8(250))])
    g.outputs = [ra, rb, fb]
    feeds = [full_range(np.int8, (3, 5)), full_range(np.uint8, (7,))]
    compiled = BACKEND.compile(g)
    runner = compiled.info["runner"]
    for v in (qa, qb, fa, ra, fb, rb):
        assert runner.value_range(v)[0] % 4 == 0
    got = compiled(*feeds)
    assert_matches_reference(g, feeds, got, rtol=0, atol=0)
    assert got[0].dtype == np.int8 and got[1].dtype == np.uint8


def test_gather_of_int8_data_and_its_range_check() -> None:
    """A quantized embedding table (int8 [V, D]) gathered by int64 ids, negative ids wrapping; an id out of
    range is an EdgerunError, as on the reference."""
    table = full_range(np.int8, (11, 6))
    ids = np.array([[0, 10, -1], [3, 3, -11]], np.int64)
    run_one("gather", [table, ids], [True, False], axis=0)
    run_one("gather", [full_range(np.uint8, (3, 5, 7)), np.array([4, 0], np.int64)], [False, True], axis=1)
    graph = one_node_graph("gather", [table, ids], [True, False], axis=0)
    with pytest.raises(EdgerunError, match="gather index out of range"):
        BACKEND.compile(graph)(np.array([[0, 11, 0], [0, 0, 0]], np.int64))


def on_webgpu(loaded: Any) -> set[str]:
    return {p.backend for p in loaded.parts.partitions}


def assert_int8_nodes_exact(program: Any, feeds: list[np.ndarray]) -> int:
    """Every node int8.py computes, run alone on webgpu with the oracle's values of its inputs in the whole
    program, equals the oracle's outputs bit for bit (float ones within float32 rounding): the proof that a
    whole-model difference comes from the float ops' rounding, not from the integer kernels. Returns the
    number of nodes checked."""
    from edgerun.backends.webgpu.int8 import is_int8_node
    from edgerun.oracle import interpret

    graph = program.graph
    nodes = [n for n in graph.nodes if is_int8_node(n, graph)]
    wanted = sorted({v for n in nodes for v in (*n.inputs, *n.outputs) if v and v not in graph.constants})
    probe = graph.copy()
    probe.outputs = wanted
    values = dict(zip(wanted, interpret(probe, feeds)))
    for node in nodes:
        sub = Graph()
        names, sub_feeds = [], []
        for v in node.inputs:
            if v in graph.constants:
                names.append(sub.add_constant(np.asarray(graph.constants[v])))
            else:
                names.append(sub.add_input(f"in{len(sub_feeds)}", graph.specs[v]))
                sub_feeds.append(values[v])
        sub.outputs = Builder(sub).emit_multi(node.op, names, **node.attrs)
        for name, got in zip(node.outputs, BACKEND.compile(sub)(*sub_feeds)):
            want = values[name]
            assert got.dtype == want.dtype, (node.op, name)
            if want.dtype.kind == "f":
                np.testing.assert_allclose(got, want, rtol=1e-7, atol=0, err_msg=f"{node.op} {name}")
            else:
                assert np.array_equal(got, want), (node.op, name)
    return len(nodes)


@pytest.mark.parametrize("scheme", ["int8-static", "int8-dynamic"])
def test_quantized_small_cnn_runs_whole_on_webgpu(scheme: str) -> None:
    images = np.random.default_rng(1).standard_normal((3, 2, 3, 12, 12)).astype(np.float32)
    q = edgerun.quantize(small_cnn((2, 3, 12, 12), hidden=32, seed=0), scheme=scheme,
                         calibration={"image": images} if scheme == "int8-static" else None)
    ops = {n.op for n in q.graph.nodes}
    assert {"conv_integer", "matmul_integer", "dynamic_quantize", "dequantize_linear"} <= ops
    loaded = edgerun.load(q, ["webgpu"])
    assert on_webgpu(loaded) == {"webgpu"}
    want = edgerun.load(q, ["reference"])
    for seed in (10, 11):
        x = np.random.default_rng(seed).standard_normal((2, 3, 12, 12)).astype(np.float32)
        for got, ref in zip(loaded.run([x]), want.run([x])):
            assert got.dtype == ref.dtype
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
    runners = [c.info["runner"] for c in loaded.parts.compiled]
    assert all(r.stats.replays == 1 for r in runners)  # the second call replayed the captured dispatches


def check_quantized_zoo_model(name: str, scheme: str, tmp_path: Path) -> tuple[float, int]:
    """Zoo model `name` at its small size, quantized, loaded with backends=["webgpu"]: every node placed
    there, each int8 node exact on the model's own values; (relative whole-model error, int8 nodes)."""
    from webgpu_testkit import export_small

    program, feeds = export_small(name, str(tmp_path))
    calibration = {program.graph.inputs[0]: np.stack([feeds[0], feeds[0] * 0.5])} if scheme == "int8-static" else None
    q = edgerun.quantize(program, scheme=scheme, calibration=calibration)
    loaded = edgerun.load(q, ["webgpu"])
    assert on_webgpu(loaded) == {"webgpu"}
    got, want = loaded.run(feeds)[0], edgerun.load(q, ["reference"]).run(feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    checked = assert_int8_nodes_exact(q, feeds)
    err = float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())
    return err, checked


def test_quantized_zoo_cnn_int8_static_whole_on_webgpu(tmp_path: Path) -> None:
    """SqueezeNet 1.1 at 64x64, int8-static (quantize, conv_integer, requantize float32, dequantize): the
    integer path is exact, the float ops between (pools, concat, softmax) round as float32 does."""
    err, checked = check_quantized_zoo_model("squeezenet1_1", "int8-static", tmp_path)
    assert checked >= 50 and err <= 1e-5, (checked, err)


def test_quantized_mlp_int8_dynamic_whole_on_webgpu(tmp_path: Path) -> None:
    err, checked = check_quantized_zoo_model("mlp", "int8-dynamic", tmp_path)
    assert checked >= 6 and err <= 1e-5, (checked, err)


def test_quantized_minilm_int8_dynamic_whole_on_webgpu(tmp_path: Path) -> None:
    """MiniLM int8-dynamic, its int8 embedding table gathered on the device: all 110 int8 nodes exact on the
    model's own values. End to end the output differs from the reference's by about half the quantization
    error itself (measured 6.7 % of max |output|, against 12.6 % float vs quantized): the float ops'
    last-bit differences (layer norm, softmax, GELU) move a per-tensor dynamic scale, and every code after
    it. So the whole-model bound here is the quantization error's, not float32's."""
    err, checked = check_quantized_zoo_model("minilm_l6", "int8-dynamic", tmp_path)
    assert checked >= 100 and err <= 0.15, (checked, err)
