"""Raster on the ONNX Runtime delegate: the recognised patterns (reshape, transpose, slice, flip, broadcast)
compile without a gather, and every form, patterns or the generic gather, matches the reference."""

from __future__ import annotations

import math
from collections.abc import Sequence

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
from edgerun.ir.ops.raster import strided_copy_regions
from edgerun.ir.tensor_spec import TensorSpec

ORT = OnnxRuntimeBackend(threads=1)
RNG = np.random.default_rng(1)


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[k + 1:]) for k in range(len(shape))]


def view_regions(shape: Sequence[int], starts: Sequence[int], steps: Sequence[int],
                 sizes: Sequence[int]) -> list[list[int]]:
    """Regions copying the strided view x[start::step][:size] of a contiguous `shape` into a dense output."""
    strides = contiguous_strides(shape)
    offset = sum(s * st for s, st in zip(starts, strides))
    return strided_copy_regions(0, offset, [st * sp for st, sp in zip(strides, steps)], 0,
                                contiguous_strides(sizes), sizes)


def transpose_regions(shape: Sequence[int], perm: Sequence[int]) -> list[list[int]]:
    strides = contiguous_strides(shape)
    out_shape = [shape[p] for p in perm]
    return strided_copy_regions(0, 0, [strides[p] for p in perm], 0, contiguous_strides(out_shape), out_shape)


def raster_graph(sources: Sequence[np.ndarray], out_shape: Sequence[int], regions: list[list[int]],
                 fill: object = None) -> Graph:
    g = Graph()
    names = [g.add_input(f"s{k}", TensorSpec(x.shape, DType.of(x))) for k, x in enumerate(sources)]
    g.outputs = [Builder(g).emit("raster", names, shape=list(out_shape), regions=regions, fill=fill)]
    return g


def onnx_op_types(graph: Graph) -> list[str]:
    return [n.op_type for n in build_model(graph)[0].graph.node]


X = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
PATTERNS = {
    "reshape": ([X], [6, 20], view_regions(X.shape, [0] * 4, [1] * 4, X.shape)),
    "transpose": ([X], [2, 4, 5, 3], transpose_regions(X.shape, [0, 2, 3, 1])),
    "transpose-inner": ([X], [2, 3, 5, 4], transpose_regions(X.shape, [0, 1, 3, 2])),
    "slice-steps": ([X], [2, 2, 2, 2], view_regions(X.shape, [0, 1, 0, 1], [1, 1, 2, 3], [2, 2, 2, 2])),
    "slice-offset": ([X], [1, 3, 2, 5], view_regions(X.shape, [1, 0, 2, 0], [1, 1, 1, 1], [1, 3, 2, 5])),
    "flip": ([X], [2, 3, 4, 5], view_regions(X.shape, [1, 0, 3, 4], [-1, 1, -1, -1], [2, 3, 4, 5])),
    "broadcast": ([X[0, 0]], [3, 4, 5],
                  strided_copy_regions(0, 0, [0, 5, 1], 0, [20, 5, 1], [3, 4, 5])),
    "broadcast-inner": ([X[0, 0, 0]], [5, 3],
                        strided_copy_regions(0, 0, [1, 0], 0, [3, 1], [5, 3])),
}


@pytest.mark.parametrize("name", list(PATTERNS))
def test_pattern_compiles_without_gather_and_matches(name: str) -> None:
    sources, out_shape, regions = PATTERNS[name]
    assert len(regions) == 1
    graph = raster_graph(sources, out_shape, regions)
    compiled = ORT.compile(graph)
    assert compiled.info["gathered_rasters"] == 0
    assert_matches_reference(graph, sources, compiled(*sources), rtol=0, atol=0)


def test_pad_with_fill_is_a_constant_pad() -> None:
    x = RNG.standard_normal((3, 4)).astype(np.float32)
    regions = strided_copy_regions(0, 0, [4, 1], 6 + 1, [6, 1], [3, 4])  # into the middle of a 5x6 output
    graph = raster_graph([x], [5, 6], regions, fill=-1.5)
    compiled = ORT.compile(graph)
    assert compiled.info["gathered_rasters"] == 0
    assert "Pad" in onnx_op_types(graph)
    assert_matches_reference(graph, [x], compiled(x), rtol=0, atol=0)


def test_concat_of_two_sources_with_overlapping_later_region() -> None:
    a = RNG.integers(0, 100, (2, 3)).astype(np.int64)
    b = RNG.integers(0, 100, (2, 2)).astype(np.int64)
    regions = (strided_copy_regions(0, 0, [3, 1], 0, [5, 1], [2, 3])
               + strided_copy_regions(1, 0, [2, 1], 3, [5, 1], [2, 2])
               + [[1, 0, 0, 0, 1, 4, 0, 0, 1, 1, 1, 1]])  # regions apply in order: the last one wins
    graph = raster_graph([a, b], [2, 5], regions)
    assert_matches_reference(graph, [a, b], ORT.compile(graph)(a, b), rtol=0, atol=0)


def test_many_dimension_transpose_unrolled_into_regions() -> None:
    x = RNG.random((2, 3, 2, 3, 2)) > 0.5  # bool: data movement runs on every dtype
    regions = transpose_regions(x.shape, [4, 2, 0, 3, 1])
    assert len(regions) > 1
    graph = raster_graph([x], [2, 2, 2, 3, 3], regions)
    assert_matches_reference(graph, [x], ORT.compile(graph)(x), rtol=0, atol=0)


def test_strides_that_do_not_nest_fall_back_to_gather() -> None:
    x = RNG.standard_normal(120).astype(np.float32)
    regions = [[0, 1, 0, 7, 3, 0, 0, 12, 1, 1, 12, 12]]  # out[i, j] = x[1 + 7i + 3j]: the rows overlap
    graph = raster_graph([x], [12, 12], regions)
    compiled = ORT.compile(graph)
    assert compiled.info["gathered_rasters"] == 1
    assert_matches_reference(graph, [x], compiled(x), rtol=0, atol=0)


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_random_strided_views_match_reference(data: st.DataObject) -> None:
    rank = data.draw(st.integers(1, 4))
    shape = data.draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    starts, steps, sizes = [], [], []
    for n in shape:
        step = data.draw(st.sampled_from([1, 1, 2, 3, -1, -2, 0]))
        start = data.draw(st.integers(0, n - 1))
        room = start + 1 if step < 0 else n - start
        size = 1 + (room - 1) // abs(step) if step else data.draw(st.integers(1, 3))
        starts.append(start)
        steps.append(step)
        sizes.append(data.draw(st.integers(1, size)))
    perm = data.draw(st.permutations(range(rank)))
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)
    strides = contiguous_strides(shape)
    offset = sum(s * st_ for s, st_ in zip(starts, strides))
    src_strides = [strides[k] * steps[k] for k in perm]
    out_shape = [sizes[k] for k in perm]
    regions = strided_copy_regions(0, offset, src_strides, 0, contiguous_strides(out_shape), out_shape)
    graph = raster_graph([x], out_shape, regions)
    assert_matches_reference(graph, [x], ORT.compile(graph)(x), rtol=0, atol=0)


def test_concat_of_transposed_and_sliced_pieces_compiles_to_concat() -> None:
    a = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal((3, 6)).astype(np.float32)
    # out (3, 7) = concat([a.T, b[:, 1::2]], axis=1), the second piece listed first.
    regions = (strided_copy_regions(1, 1, [6, 2], 4, [7, 1], [3, 3])
               + strided_copy_regions(0, 0, [1, 3], 0, [7, 1], [3, 4]))
    graph = raster_graph([a, b], [3, 7], regions)
    compiled = ORT.compile(graph)
    assert compiled.info["gathered_rasters"] == 0
    assert_matches_reference(graph, [a, b], compiled(a, b), rtol=0, atol=0)


def test_channel_shuffle_of_a_concat_compiles_to_concat() -> None:
    a = RNG.standard_normal((1, 4, 3, 3)).astype(np.float32)
    b = RNG.standard_normal((1, 4, 3, 3)).astype(np.float32)
    # out channel 2i is a[i] and 2i+1 is b[i]: concat along channels, then shuffle with 2 groups.
    regions = [[0, 0, 0, 9, 1, 0, 0, 18, 1, 1, 4, 9], [1, 0, 0, 9, 1, 9, 0, 18, 1, 1, 4, 9]]
    graph = raster_graph([a, b], [1, 8, 3, 3], regions)
    compiled = ORT.compile(graph)
    assert compiled.info["gathered_rasters"] == 0
    assert_matches_reference(graph, [a, b], compiled(a, b), rtol=0, atol=0)


def test_merged_shuffle_chain_is_one_row_gather() -> None:
    # ShuffleNet's shuffles merged with their concats and splits: each output channel (a row of 16) is a
    # channel of one of several sources, interleaved at strides of 2 and 4 channels with uneven counts.
    sources = [RNG.standard_normal((1, 6, 4, 4)).astype(np.float32) for _ in range(3)]
    regions = [[0, 0, 0, 16, 1, 16, 0, 32, 1, 1, 5, 16],  # src0 channels 0-4 -> 1, 3, 5, 7, 9
               [1, 0, 0, 16, 1, 0, 0, 64, 1, 1, 3, 16],  # src1 channels 0-2 -> 0, 4, 8
               [2, 32, 0, 16, 1, 32, 0, 64, 1, 1, 2, 16]]  # src2 channels 2-3 -> 2, 6
    graph = raster_graph(sources, [1, 10, 4, 4], regions)
    model = build_model(graph)[0]
    types = [n.op_type for n in model.graph.node]
    assert types.count("Gather") == 1 and not {"ScatterElements", "Range"} & set(types)
    index = next(t for t in model.graph.initializer if "row_index" in t.name)
    assert list(index.dims) == [10]  # one int64 per output row, none per element
    assert_matches_reference(graph, sources, ORT.compile(graph)(*sources), rtol=0, atol=0)


def test_row_gather_fills_unwritten_rows_and_later_regions_win() -> None:
    a = RNG.standard_normal((4, 32)).astype(np.float32)
    # Rows 0 and 2 from a's rows 3 and 1 (stride -2 rows), row 2 written again from a's row 0; rows 1, 3
    # are left to the fill.
    regions = [[0, 96, 0, -64, 1, 0, 0, 64, 1, 1, 2, 32], [0, 0, 0, 0, 1, 64, 0, 0, 1, 1, 1, 32]]
    graph = raster_graph([a], [4, 32], regions, fill=1.5)
    types = onnx_op_types(graph)
    assert "Gather" in types and not {"ScatterElements", "Range"} & set(types)
    assert_matches_reference(graph, [a], ORT.compile(graph)(a), rtol=0, atol=0)


def test_concat_reaches_ort_without_reshapes_to_its_own_shape() -> None:
    # The readings work on flat views; the Reshapes back to shapes values already have are dropped.
    a = RNG.standard_normal((1, 20, 16)).astype(np.float32)
    b = RNG.standard_normal((1, 20, 8)).astype(np.float32)
    regions = [[0, 0, 0, 16, 1, 0, 0, 24, 1, 1, 20, 16], [1, 0, 0, 8, 1, 16, 0, 24, 1, 1, 20, 8]]
    graph = raster_graph([a, b], [1, 20, 24], regions)
    assert onnx_op_types(graph) == ["Concat"]
    assert_matches_reference(graph, [a, b], ORT.compile(graph)(a, b), rtol=0, atol=0)


def test_broadcast_pieces_of_a_concat_expand_straight_to_their_shape() -> None:
    # DIN's feature rows: two [1, 16] rows broadcast over 20 positions and concatenated. Each piece is read
    # as Expand then Reshape to [1, 20, 16]; the Expand now writes that shape itself (no Reshape after it).
    a = RNG.standard_normal((1, 16)).astype(np.float32)
    b = RNG.standard_normal((1, 16)).astype(np.float32)
    regions = [[0, 0, 0, 0, 1, 0, 0, 32, 1, 1, 20, 16], [1, 0, 0, 0, 1, 16, 0, 32, 1, 1, 20, 16]]
    graph = raster_graph([a, b], [1, 20, 32], regions)
    types = onnx_op_types(graph)
    assert types.count("Expand") == 2 and "Reshape" not in types and "Concat" in types, types
    assert_matches_reference(graph, [a, b], ORT.compile(graph)(a, b), rtol=0, atol=0)
