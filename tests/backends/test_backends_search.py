"""Load-time search: calibration cached per device fingerprint, the cost model's choices, tuning, and the
reference backend's conv algorithm variants."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from edgerun.backends.registry import get_backend
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import KERNELS, interpret
from edgerun.oracle.conv_algorithms import BY_NAME, CONV_ALGORITHMS, ConvShape
from edgerun.search import (
    CACHE_ENV,
    BackendProfile,
    auto_backends,
    calibration_path,
    cost_table,
    device_fingerprint,
    load,
    load_profiles,
    plan_auto,
    program_key,
    search_placement,
    tuned_path,
)
from edgerun.search.calibrate import backend_config, calibrated, measure_backend
from edgerun.search.cost_model import cheapest_algorithm
from edgerun.search.placement_search import SWITCH_S
from edgerun.search.tune import MARGINS

RNG = np.random.default_rng(3)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("edgerun-cache")  # one calibration for the module's tests


@pytest.fixture
def cache(shared_cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(CACHE_ENV, str(shared_cache))
    return shared_cache


def conv_net(channels: int = 8, size: int = 16, blocks: int = 2) -> Graph:
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", TensorSpec((1, channels, size, size), DType.float32))
    for _ in range(blocks):
        w = b.const(RNG.standard_normal((channels, channels, 3, 3)).astype(np.float32) * 0.1)
        v = b.emit("conv2d", [v, w], padding=[1, 1, 1, 1])
        v = b.emit("tanh", [v])
    g.outputs = [b.emit("reduce_mean", [v], axes=[2, 3])]
    return g


def profile(gemm: float, conv: float, partition_s: float = 0.0) -> BackendProfile:
    return BackendProfile(gemm, conv, 1e9, 1e10, 1e-6, partition_s, algorithm_scale={})


def test_calibration_is_cached_under_the_device_fingerprint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    cache = tmp_path
    reference = get_backend("reference")
    first = load_profiles([reference])["reference"]
    path = calibration_path()
    assert path.parent.parent == cache and path.stem == device_fingerprint()
    stored = json.loads(path.read_text())
    assert stored["profiles"]["reference"]["gemm_flops_per_s"] == first.gemm_flops_per_s
    assert first.measured and first.gemm_flops_per_s > 0 and set(first.algorithm_scale) == {
        a.name for a in CONV_ALGORITHMS}
    # A second load reads the cache instead of measuring (the figures are identical, not re-measured).
    assert load_profiles([reference])["reference"] == first
    # Another machine (another fingerprint) does not see this one's figures.
    assert not calibration_path("another-device").exists()


def test_search_puts_big_convs_on_the_faster_backend_and_tiny_work_where_calls_are_cheap() -> None:
    ort = pytest.importorskip("edgerun.backends.onnxruntime").OnnxRuntimeBackend()
    reference = get_backend("reference")
    backends = {"onnxruntime": ort, "reference": reference}
    profiles = {"onnxruntime": profile(5e10, 5e10, partition_s=2e-5), "reference": profile(1e10, 1e9)}
    big = conv_net(channels=64, size=32)
    result = search_placement(cost_table(big, backends, profiles))
    assert set(result.backend_of) == {"onnxruntime"}
    # Four tiny nodes: a 20 us partition call costs more than the reference's whole work.
    tiny = conv_net(channels=1, size=2, blocks=2)
    result = search_placement(cost_table(tiny, backends, profiles))
    assert set(result.backend_of) == {"reference"}


def test_search_cuts_a_partition_only_when_it_pays() -> None:
    ort = pytest.importorskip("edgerun.backends.onnxruntime").OnnxRuntimeBackend()
    backends = {"onnxruntime": ort, "reference": get_backend("reference")}
    g = conv_net(channels=32, size=16)
    cheap = {"onnxruntime": profile(5e10, 5e10, partition_s=1e-6), "reference": profile(1e10, 1e9)}
    table = cost_table(g, backends, cheap)
    # Make tanh far cheaper on reference: with cheap partitions the search alternates ...
    tanh = [k for k, n in enumerate(g.nodes) if n.op == "tanh"]
    table.seconds[tanh, table.backends.index("onnxruntime")] = 1e-3
    assert search_placement(table).switches > 1
    # ... and with a partition bound of one it does not.
    assert search_placement(table, max_partitions=1).switches == 1


def test_auto_load_matches_reference_and_records_conv_algorithms(cache: Path) -> None:
    g = conv_net()
    x = RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)
    want = load(g).run([x])[0]
    plan = plan_auto(g.copy(), candidates=["reference"])
    assert set(plan.placement.values()) == {"reference"}
    assert set(plan.algorithms.values()) <= {a.name for a in CONV_ALGORITHMS} and len(plan.algorithms) == 2
    loaded = load(g, backends="auto:reference")
    np.testing.assert_allclose(loaded.run([x])[0], want, rtol=1e-4, atol=1e-5)
    # The choice reaches the reference backend with the placement (its conv calls are the chosen kernels);
    # the graph (which a Program may save) carries nothing.
    bound = {getattr(i.call, "func", None) for i in loaded.instructions if i.op == "conv2d"}
    assert bound == {BY_NAME[a].kernel for a in plan.algorithms.values()}
    assert all("algorithm" not in n.meta for n in g.nodes)


def test_tune_measures_candidates_and_caches_the_winner(cache: Path) -> None:
    pytest.importorskip("onnxruntime")
    g = conv_net()
    x = RNG.standard_normal((1, 8, 16, 16)).astype(np.float32)
    plan = plan_auto(g.copy(), tune=True)
    assert plan.tuning["source"] == "measured" and len(plan.tuning["candidates"]) >= 2
    # Cached per (device, program, candidate backends).
    names = "+".join(sorted(b.identity() for b in auto_backends()))  # onnxruntime and reference, mnn where installed
    files = list((cache / "tuned" / device_fingerprint()).glob(f"{program_key(g, None)}.{names}.json"))
    assert len(files) == 1
    winner = json.loads(files[0].read_text())["placement"]
    assert winner == plan.placement
    again = plan_auto(g.copy(), tune=True)
    assert again.tuning["source"] == "cache" and again.placement == plan.placement
    assert tuned_path("x").parent == files[0].parent
    got = load(g.copy(), backends="auto", tune=True).run([x])[0]
    np.testing.assert_allclose(got, load(g).run([x])[0], rtol=1e-4, atol=1e-5)


CONV_CASES = [
    ("3x3", (2, 16, 13, 13), (24, 16, 3, 3), {"padding": [1, 1, 1, 1]}),
    ("3x3-asym-pad", (1, 8, 10, 9), (8, 8, 3, 3), {"padding": [0, 2, 1, 0]}),
    ("pointwise", (1, 32, 7, 7), (16, 32, 1, 1), {}),
    ("depthwise", (1, 12, 9, 9), (12, 1, 3, 3), {"padding": [1, 1, 1, 1], "groups": 12, "stride": [2, 2]}),
    ("grouped-dilated", (1, 8, 12, 12), (8, 4, 3, 3), {"padding": [2, 2, 2, 2], "groups": 2, "dilation": [2, 2]}),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=[c[0] for c in CONV_CASES])
def test_every_applicable_conv_algorithm_agrees_with_the_default_kernel(
        case: tuple[str, tuple[int, ...], tuple[int, ...], dict[str, object]]) -> None:
    name, xs, ws, attrs = case
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal(ws).astype(np.float32)
    bias = RNG.standard_normal(ws[0]).astype(np.float32)
    g = Graph()
    b = Builder(g)
    out = b.emit("conv2d", [g.add_input("x", TensorSpec(xs, DType.float32)), b.const(w), b.const(bias)], **attrs)
    node = g.nodes[0]
    want = np.empty(g.specs[out].shape, np.float32)
    KERNELS["conv2d"]([x, w, bias], node.attrs, [want])
    shape = ConvShape.of(node, g)
    applicable = [a for a in CONV_ALGORITHMS if a.applies(shape)]
    assert len(applicable) >= (1 if name == "grouped-dilated" else 2)  # im2col and a specialised variant
    for algorithm in applicable:
        got = np.empty_like(want)
        algorithm.kernel([x, w, bias], dict(node.attrs), [got])
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()),
                                   err_msg=algorithm.name)
        reference = get_backend("reference")
        chosen = cheapest_algorithm(node, g, BackendProfile.from_throughput(reference.throughput), reference)
        assert chosen is not None and chosen[0] in {a.name for a in applicable} and math.isfinite(chosen[1])


def test_algorithm_choice_follows_the_measured_rates() -> None:
    g = Graph()
    b = Builder(g)
    w = b.const(np.ones((64, 64, 3, 3), np.float32))
    b.emit("conv2d", [g.add_input("x", TensorSpec((1, 64, 56, 56), DType.float32)), w], padding=[1, 1, 1, 1])
    node = g.nodes[0]
    fast_gemm = BackendProfile(1e11, 1e9, 1e10, 1e11, 1e-6, 0.0)
    reference = get_backend("reference")
    assert (cheapest_algorithm(node, g, fast_gemm, reference) or ("",))[0] == "winograd_f2x3"
    slow_winograd = BackendProfile(1e11, 1e9, 1e10, 1e11, 1e-6, 0.0, algorithm_scale={"winograd_f2x3": 100.0})
    assert (cheapest_algorithm(node, g, slow_winograd, reference) or ("",))[0] == "im2col_gemm"


def test_activations_stay_fused_with_their_conv_on_a_fusing_backend() -> None:
    ort = pytest.importorskip("edgerun.backends.onnxruntime").OnnxRuntimeBackend()
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((1, 32, 56, 56), DType.float32))
    w = b.const(RNG.standard_normal((32, 32, 3, 3)).astype(np.float32))
    y = b.emit("conv2d", [x, w], padding=[1, 1, 1, 1])
    y = b.emit("minimum", [b.emit("maximum", [y, b.scalar(0.0, y)]), b.scalar(6.0, y)])
    g.outputs = [b.emit("conv2d", [y, w], padding=[1, 1, 1, 1])]
    # Elementwise work is modelled a little cheaper on reference and a partition call is nearly free ...
    profiles = {"onnxruntime": BackendProfile(5e10, 5e10, 1e9, 9e9, 1e-6, 1e-7),
                "reference": BackendProfile(1e10, 1e9, 1e9, 1e10, 1e-6, 0.0)}
    table = cost_table(g, {"onnxruntime": ort, "reference": get_backend("reference")}, profiles)
    # ... yet the clamp stays on ORT, which folds it into the conv before it.
    assert search_placement(table).backend_of == ["onnxruntime"] * 4
    assert table.fused_saving[1:3, 0].min() > 0 and table.fused_saving[:, 1].max() == 0


def test_calibration_chooses_ort_spinning_unless_the_user_fixed_it(monkeypatch: pytest.MonkeyPatch) -> None:
    ort_backend = pytest.importorskip("edgerun.backends.onnxruntime")
    monkeypatch.delenv("EDGERUN_ORT_SPIN", raising=False)
    free = ort_backend.OnnxRuntimeBackend()
    assert free.spin_setting is None and free.spin is False  # off until calibration says otherwise
    chosen = measure_backend(free)
    assert isinstance(chosen.settings["spin"], bool) and chosen.gemm_flops_per_s > 0
    assert calibrated(free, replace(chosen, settings={"spin": True})).spin is True and free.spin is False
    assert "spin_setting=None" in chosen.config
    monkeypatch.setenv("EDGERUN_ORT_SPIN", "0")  # the variable still overrides calibration
    fixed = ort_backend.OnnxRuntimeBackend()
    assert fixed.spin_setting is False and backend_config(fixed) != backend_config(free)
    assert calibrated(fixed, replace(chosen, settings={"spin": True})) is fixed and fixed.spin is False


def test_a_delegate_only_program_runs_without_errstate_and_still_matches() -> None:
    pytest.importorskip("onnxruntime")
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((4, 8), DType.float32))
    w = b.const(RNG.standard_normal((8, 8)).astype(np.float32))
    g.outputs = [b.emit("tanh", [b.emit("matmul", [x, w])])]
    xs = [RNG.standard_normal((4, 8)).astype(np.float32)]
    delegated = load(g, backends=["onnxruntime"])
    assert {i.backend for i in delegated.instructions} == {"onnxruntime"}
    assert not delegated._executor._binds_kernels
    assert load(g)._executor._binds_kernels
    before = np.geterr()
    first = delegated(*xs)
    np.testing.assert_allclose(first, interpret(g, xs)[0], rtol=1e-5, atol=1e-6)
    assert np.geterr() == before
    delegated(*[-v for v in xs])
    assert not np.shares_memory(first, delegated.parts.arena)  # the first result survives the second call
    np.testing.assert_allclose(first, interpret(g, xs)[0], rtol=1e-5, atol=1e-6)


def test_first_auto_load_measures_candidates_within_its_budget_and_caches_the_winner(cache: Path) -> None:
    g = conv_net(channels=4, blocks=3)  # not the other tests' program: nothing cached for it yet
    x = RNG.standard_normal((1, 4, 16, 16)).astype(np.float32)
    unmeasured = plan_auto(g.copy(), measure_budget_s=0.0)
    assert unmeasured.tuning == {} and unmeasured.loaded is None
    # A budget already spent still measures the optimum and every backend alone (auto must never lose to
    # one of them), nothing more, and caches nothing unless every candidate was measured.
    rushed = plan_auto(g.copy(), measure_budget_s=1e-9)
    measured = [c["label"] for c in rushed.tuning["candidates"] if c["measured_s"] is not None]
    assert measured[0] == "search" and all(lb.startswith("all ") for lb in measured[1:])
    assert rushed.loaded is not None
    cached = list(cache.glob(f"tuned/*/{program_key(g, None)}.*"))
    assert len(cached) == (1 if rushed.tuning["complete"] else 0)
    # The plain auto load measures every candidate it does not rule out on purpose (a conv net is quick)
    # and hands back the winner loaded.
    g = conv_net(channels=4, blocks=4)
    first = load(g.copy(), backends="auto")
    report = first.search.tuning
    assert report["source"] == "measured" and report["complete"]
    measured = [c for c in report["candidates"] if c["measured_s"] is not None]
    # The optimum is measured; the cheapest-built single engine close to it may go first (tune.measuring_order).
    assert "search" in [c["label"] for c in measured[:2]] and measured[0]["label"] in ("search", *(
        c["label"] for c in measured if c["label"].startswith("all ")))
    assert all(c.get("skipped") for c in report["candidates"] if c["measured_s"] is None)
    # The fastest wins, a placement over more backends only by the mixed margin per extra backend.
    assert report["winner"] == min(measured, key=lambda c: c["measured_s"] * MARGINS.mixed_margin ** (
        c["backends"] - 1))["label"]
    again = load(g.copy(), backends="auto")
    assert again.search.tuning["source"] == "cache"
    np.testing.assert_allclose(again.run([x])[0], load(g).run([x])[0], rtol=1e-4, atol=1e-5)


def test_search_does_not_switch_backends_for_less_than_a_switch_costs() -> None:
    ort = pytest.importorskip("edgerun.backends.onnxruntime").OnnxRuntimeBackend()
    backends = {"onnxruntime": ort, "reference": get_backend("reference")}
    g = conv_net(channels=32, size=16)
    table = cost_table(g, backends, {"onnxruntime": profile(5e10, 5e10, partition_s=1e-6),
                                     "reference": profile(1e10, 1e9, partition_s=1e-6)})
    ort_col, ref_col = table.backends.index("onnxruntime"), table.backends.index("reference")
    last = len(g.nodes) - 1  # the reduce_mean at the end: modelled a little cheaper on the reference
    table.seconds[last, ref_col] = table.seconds[last, ort_col] - SWITCH_S / 2
    assert set(search_placement(table).backend_of) == {"onnxruntime"}
    table.seconds[last, ref_col] = table.seconds[last, ort_col] - 4 * SWITCH_S  # a real gain: worth a switch
    assert search_placement(table).backend_of[last] == "reference"


def test_calibration_measures_build_times_that_estimate_a_placements_build(
        cache: Path) -> None:
    pytest.importorskip("onnxruntime")
    from edgerun.search.auto import build_seconds

    backends = {b.name: b for b in auto_backends()}
    profiles = load_profiles(list(backends.values()))
    assert profiles["onnxruntime"].compile_s > 0 and profiles["onnxruntime"].compile_s_per_node >= 0
    g = conv_net(channels=8, size=16, blocks=3)
    on_ort = build_seconds(g, profiles, {n.name: "onnxruntime" for n in g.nodes})
    assert on_ort > build_seconds(g, profiles, {n.name: "reference" for n in g.nodes}) >= 0  # binding is cheap
