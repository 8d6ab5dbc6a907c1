"""The MNN backend: every op it claims against the reference kernels, zoo models placed whole on MNN and
mixed with the reference and ONNX Runtime, a real model from a wheel, and a clear refusal when MNN is absent."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("MNN", reason="MNN is not installed (pip install edgerun[mnn])")
pytest.importorskip("onnxruntime", reason="the MNN backend emits ONNX with the onnxruntime package's emitter")

from backends_testkit import assert_matches_reference, one_node_graph, relative_error

from edgerun.backends.mnn import INT64_OPS, UNSUPPORTED, MnnBackend
from edgerun.backends.registry import get_backend
from edgerun.errors import EdgerunError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec

MNN = MnnBackend(threads=1)
RNG = np.random.default_rng(3)


def _op_cases() -> list[tuple[str, str, list[np.ndarray], dict[str, Any]]]:
    from test_backends_ort_ops import CASES, boolean, f32, ints

    # `where` with operands of the output's shape or one element (the shared cases broadcast a row, which
    # MNN's Where reads past its end: not claimed).
    return [*CASES, ("where-full", "where", [boolean(3, 4), f32(3, 4), f32(3, 4)], {}),
            ("where-scalar", "where", [boolean(2, 3, 4), f32(), f32(2, 3, 4)], {}),
            ("where-int32-one", "where", [boolean(3, 4), ints(np.int32, 3, 4), ints(np.int32, 1, 1)], {})]


OP_CASES = _op_cases()


@pytest.mark.parametrize("case", OP_CASES, ids=[c[0] for c in OP_CASES])
def test_claimed_op_matches_reference(case: tuple[str, str, list[np.ndarray], dict[str, Any]]) -> None:
    _, op, inputs, attrs = case
    graph = one_node_graph(op, inputs, **attrs)
    if not MNN.supports(graph.nodes[0], graph):
        assert op in UNSUPPORTED or op in INT64_OPS or any(graph.specs[v].dtype is not DType.float32
                                        for v in (*graph.nodes[0].inputs, *graph.nodes[0].outputs)) \
            or op == "max_pool2d", f"mnn refuses {case[0]} without a reason in its table"
        return
    assert_matches_reference(graph, inputs, MNN.compile(graph)(*inputs), rtol=2e-5, atol=2e-6)


def test_every_op_mnn_claims_has_a_case_it_runs() -> None:
    ran = set()
    for _, op, inputs, attrs in OP_CASES:
        graph = one_node_graph(op, inputs, **attrs)
        if MNN.supports(graph.nodes[0], graph):
            ran.add(op)
    assert set(MNN.supported) - {"raster"} - ran == set()


def _composite_cases() -> list[tuple[str, str, list[np.ndarray], dict[str, Any], str]]:
    from test_backends_ort_ops import COMPOSITE_CASES

    return COMPOSITE_CASES


COMPOSITE_CASES = _composite_cases()


@pytest.mark.parametrize("case", COMPOSITE_CASES, ids=[c[0] for c in COMPOSITE_CASES])
def test_composites_run_whole_or_as_their_pieces_on_mnn(case: tuple[str, str, list[np.ndarray], dict[str, Any],
                                                                    str]) -> None:
    # Kept whole exactly when in WHOLE_COMPOSITES (GELU is approximated by MNN, rms_norm does not convert);
    # otherwise MNN still takes the composite when it runs every piece, and the runtime lowers it there.
    from edgerun import load
    from edgerun.backends.mnn import WHOLE_COMPOSITES

    _, op, inputs, attrs, _ = case
    graph = one_node_graph(op, inputs, constant=[False] + [True] * (len(inputs) - 1), **attrs)
    node = graph.nodes[0]
    ort_keeps = get_backend("onnxruntime").keeps_whole(node, graph)  # the emitter's own conditions
    assert MNN.keeps_whole(node, graph) == (op in WHOLE_COMPOSITES and ort_keeps)
    if not MNN.supports(node, graph):
        return
    loaded = load(graph, [MNN])
    assert {p.backend for p in loaded.partitions} == {"mnn"}, [(p.backend, [n.op for n in p.nodes])
                                                               for p in loaded.partitions]
    np.testing.assert_allclose(loaded.run(inputs[:1])[0], load(graph).run(inputs[:1])[0], rtol=1e-4, atol=1e-5)


def test_gelu_runs_on_mnn_as_its_pieces() -> None:
    from edgerun import load

    x = np.linspace(-6, 6, 56, dtype=np.float32).reshape(8, 7)
    graph = one_node_graph("gelu", [x])
    assert not MNN.keeps_whole(graph.nodes[0], graph) and MNN.supports(graph.nodes[0], graph)
    loaded = load(graph, [MNN])
    assert [p.backend for p in loaded.partitions] == ["mnn"] and "erf" in {n.op for n in loaded.graph.nodes}
    np.testing.assert_allclose(loaded.run([x])[0], load(graph).run([x])[0], rtol=2e-6, atol=2e-6)


def test_int32_raster_runs_on_mnn() -> None:
    x = RNG.integers(-50, 50, (6, 5, 4)).astype(np.int32)
    g = Graph()
    b = Builder(g)
    v = b.emit("transpose", [g.add_input("x", TensorSpec(x.shape, DType.int32))], perm=[1, 2, 0])
    g.outputs = [b.emit("pad", [v], pads=[[1, 1], [2, 0], [0, 0]], value=0)]
    from edgerun.passes.pipeline import optimize

    graph, _ = optimize(g)
    assert [n.op for n in graph.nodes] == ["raster"]
    assert MNN.supports(graph.nodes[0], graph)
    assert_matches_reference(graph, [x], MNN.compile(graph)(x), rtol=0, atol=0)


def _embedding_graph(rows: int, computed_indices: bool = False) -> Graph:
    # DIN's pattern: int64 ids gather rows of a table, and the same ids, compared with 0, mask the result.
    g = Graph()
    b = Builder(g)
    ids = g.add_input("ids", TensorSpec((2, 5), DType.int64))
    table = g.add_constant(RNG.standard_normal((rows, 3)).astype(np.float32))
    index = ids
    if computed_indices:
        index = b.emit("where", [b.emit("lt", [ids, b.scalar(0, ids)]), b.scalar(0, ids), ids])
    rows_out = b.emit("gather", [table, index], axis=0)
    summed = b.emit("reduce_sum", [rows_out], axes=[2], keepdims=False)
    mask = b.emit("eq", [ids, b.const(np.zeros((), np.int64))])
    g.outputs = [b.emit("where", [mask, b.const(np.array(-np.inf, np.float32)), summed])]
    return g


def test_int64_gather_and_mask_run_on_mnn_and_bad_indices_raise() -> None:
    from edgerun import load

    g = _embedding_graph(rows=7)
    assert all(MNN.supports(n, g) for n in g.nodes)
    loaded = load(g, [MNN])
    assert [p.backend for p in loaded.partitions] == ["mnn"]
    ids = np.array([[0, 3, 6, -1, -7], [2, 0, 0, 5, 1]], np.int64)
    np.testing.assert_array_equal(loaded.run([ids])[0], load(g).run([ids])[0])
    # MNN would read some row (or wrap the int64 to int32) where the reference raises: checked before the run.
    for bad in (7, -8, 2**32 + 3):
        wrong = ids.copy()
        wrong[1, 2] = bad
        with pytest.raises(EdgerunError, match=f"gather index {bad} in input 'ids' is outside \\[-7, 7\\)"):
            loaded.run([wrong])


def test_int64_values_mnn_cannot_bound_stay_elsewhere() -> None:
    g = _embedding_graph(rows=7, computed_indices=True)  # the gather's indices are computed in the graph
    claimed = {n.op for n in g.nodes if MNN.supports(n, g)}
    assert not claimed & {"gather", "lt", "eq"} and "reduce_sum" in claimed, claimed  # ids reach no gather
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((4,), DType.int64))  # compared, never a gather's index: unbounded
    g.outputs = [b.emit("eq", [x, b.const(np.zeros((), np.int64))])]
    assert not MNN.supports(g.nodes[0], g)
    g = Graph()
    b = Builder(g)
    big = b.const(np.array([2**40], np.int64))  # a constant past int32
    g.outputs = [b.emit("eq", [big, b.const(np.zeros((), np.int64))])]
    assert not MNN.supports(g.nodes[0], g)


def test_small_partitions_run_on_one_thread_unless_the_user_fixed_the_count() -> None:
    # MNN's busy-waiting pool costs more than a second thread gains on a tiny partition (DIN: 17 us on one
    # thread, 33-39 on two); calibration's choice of two still holds for real work.
    from edgerun.search.calibrate import _gemm_graph

    tuned = MnnBackend()
    tuned.apply_settings({"threads": 2})
    tiny = _embedding_graph(rows=7)
    assert tuned.partition_threads(tiny) == 1 and tuned.partition_threads(_gemm_graph()) == 2
    assert MnnBackend(threads=2).partition_threads(tiny) == 2  # fixed by the user: kept
    compiled = tuned.compile(tiny)
    assert compiled.info["threads"] == 1


# ---- whole models -----------------------------------------------------------------------------------------

torch_needed = pytest.mark.skipif(not __import__("importlib").util.find_spec("torch"), reason="torch not installed")


def _zoo(name: str) -> tuple[Graph, list[np.ndarray], float]:
    from edgerun import zoo
    from edgerun.frontends.torch import export
    from edgerun.passes.pipeline import optimize

    model = zoo.get(name)
    graph, _ = optimize(export(model.build(), model.example_inputs()).graph)
    return graph, [a.numpy() for a in model.example_inputs()], max(model.tolerance, 1e-4)


@torch_needed
@pytest.mark.parametrize("name", ["mlp", "din", "mobilenet_v2", "shufflenet_v2", "vit_tiny"])
def test_zoo_model_whole_on_mnn_matches_reference(name: str) -> None:
    from edgerun import load

    graph, args, tolerance = _zoo(name)
    want = load(graph).run(args)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a partition MNN failed to build would warn
        loaded = load(graph, [MNN])
    on_mnn = sum(len(p.nodes) for p in loaded.partitions if p.backend == "mnn")
    claimed = sum(MNN.supports(n, loaded.graph) for n in loaded.graph.nodes)
    assert on_mnn == claimed > 0.6 * len(loaded.graph.nodes), (on_mnn, claimed, len(loaded.graph.nodes))
    if name in ("mlp", "din"):  # DIN's int64 gathers, masks and feature concats included: one MNN call
        assert [p.backend for p in loaded.partitions] == ["mnn"]
    for got, ref in zip(loaded.run(args), want):
        assert got.shape == ref.shape and got.dtype == ref.dtype
        assert relative_error(got, ref) <= tolerance, relative_error(got, ref)


@torch_needed
@pytest.mark.parametrize("name", ["mlp", pytest.param("mobilenet_v2", marks=pytest.mark.slow)])
def test_mixed_placements_match_reference(name: str) -> None:
    from edgerun import load

    graph, args, tolerance = _zoo(name)
    reference = load(graph)
    want = reference.run(args)
    nodes = [n.name for n in reference.graph.nodes]
    three = ("mnn", "onnxruntime", "reference")
    placements = {
        "mnn/reference": {n: ("mnn" if k % 2 else "reference") for k, n in enumerate(nodes)},
        "mnn/onnxruntime/reference": {n: three[(k // 3) % 3] for k, n in enumerate(nodes)},
    }
    for label, placement in placements.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # nodes a backend does not claim stay on reference
            loaded = load(graph, ["mnn", "onnxruntime"], placement=placement)
        used = {p.backend for p in loaded.partitions}
        assert "mnn" in used and len(loaded.partitions) > 2, (label, used)
        for got, ref in zip(loaded.run(args), want):
            assert relative_error(got, ref) <= tolerance, (label, relative_error(got, ref))


def test_search_places_work_on_mnn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # "auto" over MNN and the reference: calibration measures MNN, and the convolution goes to it.
    from edgerun import load
    from edgerun.search import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    x = RNG.standard_normal((1, 32, 28, 28)).astype(np.float32)
    g = Graph()
    b = Builder(g)
    w = g.add_constant(RNG.standard_normal((64, 32, 3, 3)).astype(np.float32) * 0.1)
    v = b.emit("conv2d", [g.add_input("x", TensorSpec(x.shape, DType.float32)), w], stride=[1, 1],
               padding=[1, 1, 1, 1])
    g.outputs = [b.emit("maximum", [v, b.scalar(0.0, v)])]
    loaded = load(g, backends="auto:mnn,reference")
    convs_on_mnn = [n for p in loaded.partitions if p.backend == "mnn" for n in p.nodes if n.op == "conv2d"]
    assert convs_on_mnn, [(p.backend, len(p.nodes)) for p in loaded.partitions]
    assert relative_error(loaded.run([x])[0], load(g).run([x])[0]) <= 1e-4


@pytest.mark.slow
def test_real_pitch_tracker_on_mnn_matches_onnxruntime() -> None:
    import onnxruntime as ort
    from test_backends_ort_raster_layout import load_real

    from edgerun import load

    path, graph = load_real("basic-pitch")
    inputs = [RNG.standard_normal(graph.specs[v].shape).astype(np.float32) for v in graph.inputs]
    loaded = load(graph, [MNN])  # its `where` and reflect pads stay on the reference
    assert sum(len(p.nodes) for p in loaded.partitions if p.backend == "mnn") > 0.8 * len(loaded.graph.nodes)
    got = loaded.run(inputs)
    original = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = original.run(None, dict(zip([i.name for i in original.get_inputs()], inputs)))
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w.reshape(g_.shape), rtol=1e-3, atol=1e-3)


def test_registry_finds_mnn() -> None:
    assert get_backend("mnn").name == "mnn"


def test_without_mnn_the_backend_is_unavailable_with_the_extra_named() -> None:
    # A real interpreter where `import MNN` fails, as on a machine without the extra.
    code = ("import sys; sys.modules['MNN'] = None; sys.modules['_tools'] = None\n"
            "from edgerun.backends.registry import get_backend\n"
            "from edgerun.errors import BackendUnavailableError\n"
            "try:\n    get_backend('mnn')\nexcept BackendUnavailableError as e:\n    print('REFUSED', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ.copy(),
                         timeout=120)
    assert "REFUSED" in out.stdout and "pip install edgerun[mnn]" in out.stdout, out.stdout + out.stderr


def _layout_cases() -> dict[str, Any]:
    from test_backends_ort_raster_layout import CASES

    return CASES


LAYOUT_CASES = _layout_cases()


@pytest.mark.parametrize("name", list(LAYOUT_CASES))
def test_layout_rasters_on_mnn_or_left_to_others(name: str) -> None:
    # MNN claims one-region rasters read forwards with no fill but 0; the rest (which made MNN 3.6.1 abort or
    # answer wrongly) stay on the reference, and the program is still right.
    from edgerun import load

    graph, inputs, _ = LAYOUT_CASES[name]
    for node in graph.nodes:
        regions, fill = node.attrs["regions"], node.attrs.get("fill")
        simple = len(regions) == 1 and min(regions[0][2:5]) >= 0 and fill in (None, 0)
        assert MNN.supports(node, graph) == (simple or _concat_of_whole_inputs(node, graph)), name
    loaded = load(graph, [MNN])
    for got, want in zip(loaded.run(inputs), load(graph).run(inputs)):
        np.testing.assert_array_equal(got, want)


def _concat_of_whole_inputs(node: Any, graph: Graph) -> bool:
    # Worked out element by element: each region reads every element of its input (broadcast axes aside)
    # from offset 0 in order, and the regions write every output element exactly once.
    from edgerun.ir.region import regions_of

    regions = regions_of(node.attrs)
    if len(regions) < 2:
        return False
    written = np.zeros(graph.specs[node.outputs[0]].numel, np.int64)
    for r in regions:
        dst, src = r.index_grids()
        kept = [k for k in range(3) if r.src_strides[k] != 0 and r.size[k] != 1]
        order = src.reshape(r.size)[tuple(slice(None) if k in kept else 0 for k in range(3))].reshape(-1)
        if not np.array_equal(order, np.arange(graph.specs[node.inputs[r.src]].numel)):
            return False
        np.add.at(written, dst, 1)
    return bool((written == 1).all())


@given(st.data())
@settings(max_examples=30, deadline=None)
def test_random_concats_of_broadcast_inputs_on_mnn_match_reference(data: st.DataObject) -> None:
    # The many-region rasters MNN claims (DIN's feature rows): a concat of inputs, some broadcast first,
    # merged by the pipeline into one raster; run on MNN element-exact.
    from edgerun import load
    from edgerun.passes.pipeline import optimize

    rank = data.draw(st.integers(1, 4))
    shape = data.draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    axis = data.draw(st.integers(0, rank - 1))
    g = Graph()
    b = Builder(g)
    pieces, inputs = [], []
    for k in range(data.draw(st.integers(2, 4))):
        full = list(shape)
        full[axis] = data.draw(st.integers(1, 4))
        small = [n if n == 1 or not data.draw(st.booleans()) else 1 for n in full]  # broadcast some axes
        x = RNG.standard_normal(small).astype(np.float32)
        v = g.add_input(f"x{k}", TensorSpec(x.shape, DType.float32))
        pieces.append(b.emit("expand", [v], shape=full) if small != full else v)
        inputs.append(x)
    g.outputs = [b.emit("concat", pieces, axis=axis)]
    graph, _ = optimize(g)
    for node in graph.nodes:  # (a piece read as two interleaved regions is not claimed: still right)
        regions = node.attrs["regions"]
        simple = len(regions) == 1 and min(regions[0][2:5]) >= 0
        assert MNN.supports(node, graph) == (simple or _concat_of_whole_inputs(node, graph)), node.attrs
    np.testing.assert_array_equal(load(graph, [MNN]).run(inputs)[0], load(graph).run(inputs)[0])


# A child that converts the same small matmul chain again and again (no conversion cache: each one is a real
# conversion) and counts wrong answers.
_CONVERTING_CHILD = """
import sys, tempfile
from pathlib import Path
import numpy as np
from edgerun import load
from edgerun.backends.mnn import SessionRunner, convert
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec

rng = np.random.default_rng(int(sys.argv[1]))
x = rng.standard_normal((1, 16, 256)).astype(np.float32)
g = Graph()
b = Builder(g)
v = g.add_input("x", TensorSpec(x.shape, DType.float32))
for _ in range(3):
    w = g.add_constant(rng.standard_normal((256, 256)).astype(np.float32) * 0.06)
    v = b.emit("matmul", [v, w])
g.outputs = [v]
want = load(g).run([x])[0]
wrong = 0
for _ in range(12):
    with tempfile.TemporaryDirectory() as tmp:
        got = np.zeros_like(want)
        SessionRunner(convert(g, Path(tmp)), g, 1).run([x], [got])
        wrong += float(np.abs(got - want).max()) > 1e-3
print("WRONG", wrong)
"""


def test_conversions_in_two_processes_sharing_a_directory_do_not_mix_weights(tmp_path: Path) -> None:
    # MNN's converter spills weights to a scratch file named alike in the working directory; CI's two pytest
    # workers share one, and ViT came back as zeros. Two real processes converting at once, same directory.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    children = [subprocess.Popen([sys.executable, "-c", _CONVERTING_CHILD, str(seed)], cwd=tmp_path, env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in (1, 2)]
    outputs = [child.communicate(timeout=300) for child in children]
    for child, (out, err) in zip(children, outputs):
        assert child.returncode == 0, err[-2000:]
        assert "WRONG 0" in out, out
    assert list(tmp_path.iterdir()) == []  # nothing of the converter's left in the caller's directory


def test_a_converter_process_that_dies_is_an_error_and_the_next_conversion_starts_a_new_one(tmp_path: Path) -> None:
    from edgerun.backends.mnn import CONVERTER, convert
    from edgerun.errors import EdgerunError

    graph, (x,) = _matmul_chain()
    with pytest.raises(EdgerunError, match="converter process ended with exit code"):
        CONVERTER.convert(tmp_path / "no such folder", ["mnnconvert"])  # its chdir fails: the child exits
    assert CONVERTER.child is None
    folder = tmp_path / "good"
    folder.mkdir()
    assert convert(graph, folder).stat().st_size > 0
    assert relative_error(MNN.compile(graph)(x)[0], load_reference(graph, x)) <= 1e-5


def _matmul_chain() -> tuple[Graph, list[np.ndarray]]:
    x = RNG.standard_normal((1, 8, 64)).astype(np.float32)
    g = Graph()
    b = Builder(g)
    v = g.add_input("x", TensorSpec(x.shape, DType.float32))
    for _ in range(2):
        v = b.emit("matmul", [v, g.add_constant(RNG.standard_normal((64, 64)).astype(np.float32) * 0.1)])
    g.outputs = [v]
    return g, [x]


def load_reference(graph: Graph, x: np.ndarray) -> np.ndarray:
    from edgerun import load

    return load(graph).run([x])[0]


def test_a_partition_is_converted_once_per_content_on_this_machine(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from edgerun.backends.conversion_cache import CACHE_ENV
    from edgerun.backends.mnn import CONVERTER

    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    graph, (x,) = _matmul_chain()
    first = MNN.compile(graph)(x)[0]
    assert len(list((tmp_path / "conversions" / "mnn").glob("*.mnn"))) == 1
    CONVERTER.close()
    again = MNN.compile(graph)(x)[0]  # read from the cache: the converter process is not started again
    assert CONVERTER.child is None
    np.testing.assert_array_equal(again, first)
    other, _ = _matmul_chain()  # other weights: another key, a real conversion
    MNN.compile(other)
    assert CONVERTER.child is not None
    assert len(list((tmp_path / "conversions" / "mnn").glob("*.mnn"))) == 2
