"""The search prices integer products at each backend's integer rate: calibration measures it (ONNX Runtime's
QLinearConv, the reference's float64 emulation), and an int8-static program's integer layers land on the
backend that runs them fastest, with their bias add and requantize fused beside them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from small_cnn import small_cnn
from test_quant_flows import images

import edgerun
from edgerun.backends.base import INTEGER_OPS, Throughput
from edgerun.backends.registry import get_backend
from edgerun.passes.pipeline import optimize
from edgerun.runtime.loader import prepare_graph
from edgerun.search import CACHE_ENV, BackendProfile, cost_table, search_placement
from edgerun.search.auto import auto_backends, plan_auto
from edgerun.search.calibrate import measure_backend
from edgerun.search.cost_model import node_seconds

pytest.importorskip("onnxruntime")


def int8_program() -> edgerun.Program:
    return edgerun.quantize(small_cnn(), "int8-static", calibration={"image": images(3, seed=1)}, reduce_range=True)


def test_declared_integer_rate_falls_back_to_the_float_rate() -> None:
    assert Throughput(flops_per_s=3e9).integer_rate == 3e9
    assert Throughput(flops_per_s=3e9, integer_flops_per_s=7e9).integer_rate == 7e9
    ort, ref = get_backend("onnxruntime"), get_backend("reference")
    assert ort.throughput.integer_rate > ort.throughput.flops_per_s  # MLAS's u8s8 kernels
    assert ref.throughput.integer_rate < ref.throughput.flops_per_s  # float64 emulation


def test_calibration_measures_integer_rates_where_the_backend_runs_integer_products() -> None:
    ort = measure_backend(get_backend("onnxruntime"))
    ref = measure_backend(get_backend("reference"))
    for p in (ort, ref):
        assert p.measured and p.integer_gemm_flops_per_s > 0 and p.integer_conv_flops_per_s > 0
    # ORT's QLinearConv against numpy's im2col in float64: an order of magnitude, whatever the load.
    assert ort.integer_conv_flops_per_s > 5 * ref.integer_conv_flops_per_s


def test_integer_layers_are_costed_at_the_integer_rate() -> None:
    graph, _ = optimize(int8_program().graph)
    conv = next(n for n in graph.nodes if n.op == "conv_integer")
    ref = get_backend("reference")
    slow = BackendProfile(1e10, 1e10, 1e10, 1e12, 0.0, 0.0, integer_conv_flops_per_s=1e8)
    fast = BackendProfile(1e10, 1e10, 1e10, 1e12, 0.0, 0.0, integer_conv_flops_per_s=1e11)
    assert node_seconds(conv, graph, slow, ref) == pytest.approx(1000 * node_seconds(conv, graph, fast, ref))
    unmeasured = BackendProfile(1e10, 2e10, 1e9, 1e12, 0.0, 0.0)  # no integer rate: the float conv rate stands in
    assert node_seconds(conv, graph, unmeasured, ref) == pytest.approx(node_seconds(
        conv, graph, BackendProfile(1e10, 1e10, 1e9, 1e12, 0.0, 0.0, integer_conv_flops_per_s=2e10), ref))


def test_integer_layers_go_where_integer_products_are_fast_even_when_elementwise_work_is_not() -> None:
    """ORT's elementwise rate modelled 3x slower than the reference's (a noisy calibration can say so), its
    integer conv rate 100x faster: every conv_integer lands on ORT, and its int32 bias add and requantize
    (QLinearConv's epilogue) with it."""
    graph, _ = optimize(int8_program().graph)
    backends = {"onnxruntime": get_backend("onnxruntime"), "reference": get_backend("reference")}
    profiles = {"onnxruntime": BackendProfile(5e10, 5e10, 1e9, 9e9, 1e-6, 1e-6, integer_gemm_flops_per_s=1e11,
                                              integer_conv_flops_per_s=1e11),
                "reference": BackendProfile(1e10, 1e10, 3e9, 3e10, 1e-6, 0.0, integer_gemm_flops_per_s=1e9,
                                            integer_conv_flops_per_s=1e9)}
    table = cost_table(graph, backends, profiles)
    placed = dict(zip((n.name for n in graph.nodes), search_placement(table).backend_of))
    producers = graph.producers()
    integer = [n for n in graph.nodes if n.op in INTEGER_OPS]
    assert integer and all(placed[n.name] == "onnxruntime" for n in integer)
    epilogues = [n for n in graph.nodes if n.op == "requantize"]
    assert epilogues and all(placed[n.name] == "onnxruntime" for n in epilogues)
    for n in epilogues:  # the bias add between conv_integer and requantize too
        assert placed[producers[n.inputs[0]].name] == "onnxruntime"


def test_auto_places_an_int8_program_s_integer_layers_on_onnxruntime(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))  # a fresh calibration, measured now
    program = int8_program()
    candidates = ["onnxruntime", "reference"]
    graph = prepare_graph(program.graph, auto_backends(candidates))
    plan = plan_auto(graph, program, candidates=candidates)
    integer = [n.name for n in graph.nodes if n.op in INTEGER_OPS | {"requantize"}]
    assert integer and {plan.placement[name] for name in integer} == {"onnxruntime"}
    x = images(1, seed=2)[0]
    np.testing.assert_allclose(edgerun.load(program, backends="auto:onnxruntime,reference")(x)[0],
                               edgerun.load(program, backends=["reference"])(x)[0], rtol=1e-5, atol=1e-6)
