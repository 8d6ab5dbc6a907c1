"""RasterMergePass on hand-built graphs: structure after merging, and bit-exact results."""

from __future__ import annotations

import numpy as np
from passes_testkit import assert_same_outputs, decomposed, graph_with_input, rasters

from edgerun.passes.raster_merge_pass import RasterMergePass
from edgerun.passes.raster_regions import fit_regions, raster_index_map


def _merge(graph):
    plain = decomposed(graph)
    merged = RasterMergePass().call(plain.copy()).graph
    assert_same_outputs(plain, merged)
    return plain, merged


def test_transpose_reshape_slice_chain_becomes_one_raster() -> None:
    g, b, x = graph_with_input((2, 3, 4, 5))
    t = b.emit("transpose", [x], perm=[0, 2, 1, 3])
    r = b.emit("reshape", [t], shape=[2, 4, 15])
    s = b.emit("slice", [r], starts=[1, 2], ends=[4, 14], axes=[1, 2], steps=[1, 3])
    g.outputs = [s]
    plain, merged = _merge(g)
    assert len(rasters(plain)) == 3
    assert len(merged.nodes) == 1 and merged.nodes[0].inputs == ["x"]
    assert merged.nodes[0].outputs == plain.outputs


def test_attention_head_split_and_merge_compose_into_one_region() -> None:
    # [B, L, H*D] -> [B, L, H, D] -> [B, H, L, D]: the classic multi-head reshuffle.
    g, b, x = graph_with_input((2, 6, 8))
    heads = b.emit("transpose", [b.emit("reshape", [x], shape=[2, 6, 2, 4])], perm=[0, 2, 1, 3])
    g.outputs = [heads]
    plain, merged = _merge(g)
    # A 4-D permutation needs two 3-D regions; the reshape in front of it costs nothing once merged.
    assert [len(n.attrs["regions"]) for n in rasters(plain)] == [1, 2]
    assert len(merged.nodes) == 1 and len(merged.nodes[0].attrs["regions"]) == 2


def test_intermediate_raster_with_another_reader_survives() -> None:
    g, b, x = graph_with_input((4, 6))
    t = b.emit("transpose", [x], perm=[1, 0])
    s = b.emit("slice", [t], starts=[1], ends=[5], axes=[0])
    e = b.emit("exp", [t])
    g.outputs = [s, e]
    _, merged = _merge(g)
    slice_node = merged.producers()[merged.outputs[0]]
    assert slice_node.inputs == ["x"]
    assert len(rasters(merged)) == 2  # the transpose still feeds exp


def test_concat_then_slice_reads_only_the_source_it_needs() -> None:
    g, b, x = graph_with_input((2, 3))
    y = g.add_input("y", g.specs[x])
    c = b.emit("concat", [x, y], axis=1)
    s = b.emit("slice", [c], starts=[3], ends=[6], axes=[1])
    g.outputs = [s]
    _, merged = _merge(g)
    assert len(merged.nodes) == 1 and merged.nodes[0].inputs == ["y"]


def test_multi_source_concat_of_transposes_merges_into_the_concat() -> None:
    g, b, x = graph_with_input((3, 4))
    y = g.add_input("y", g.specs[x])
    c = b.emit("concat", [b.emit("transpose", [x]), b.emit("transpose", [y])], axis=0)
    g.outputs = [c]
    _, merged = _merge(g)
    assert len(merged.nodes) == 1 and merged.nodes[0].inputs == ["x", "y"]


def test_slice_of_pad_keeps_the_fill() -> None:
    g, b, x = graph_with_input((4, 4))
    p = b.emit("pad", [x], pads=[[2, 2], [1, 1]], value=7.0)
    s = b.emit("slice", [p], starts=[1, 0], ends=[5, 6], axes=[0, 1])
    g.outputs = [s]
    _, merged = _merge(g)
    (node,) = merged.nodes
    assert node.attrs["fill"] == 7.0


def test_slice_inside_pad_drops_the_fill() -> None:
    g, b, x = graph_with_input((4, 4))
    p = b.emit("pad", [x], pads=[[1, 1], [1, 1]], value=7.0)
    s = b.emit("slice", [p], starts=[1, 1], ends=[5, 5], axes=[0, 1])
    g.outputs = [s]
    _, merged = _merge(g)
    (node,) = merged.nodes
    assert node.attrs["fill"] is None


def test_pad_of_pad_with_different_values_is_not_merged() -> None:
    g, b, x = graph_with_input((3, 3))
    inner = b.emit("pad", [x], pads=[[1, 1], [1, 1]], value=1.0)
    outer = b.emit("pad", [inner], pads=[[1, 1], [1, 1]], value=2.0)
    g.outputs = [outer]
    _, merged = _merge(g)
    assert len(rasters(merged)) == 2  # one raster cannot have two fill values


def test_pad_of_pad_with_the_same_value_is_merged() -> None:
    g, b, x = graph_with_input((3, 3))
    inner = b.emit("pad", [x], pads=[[1, 0], [0, 1]], value=0.0)
    outer = b.emit("pad", [inner], pads=[[0, 2], [1, 1]], value=0.0)
    g.outputs = [outer]
    _, merged = _merge(g)
    assert len(merged.nodes) == 1 and merged.nodes[0].attrs["fill"] == 0.0


def test_identical_rasters_are_deduplicated() -> None:
    g, b, x = graph_with_input((3, 4))
    t1 = b.emit("transpose", [x])
    t2 = b.emit("transpose", [x])
    g.outputs = [b.emit("add", [b.emit("exp", [t1]), b.emit("exp", [t2])])]
    plain, merged = _merge(g)
    assert len(rasters(plain)) == 2 and len(rasters(merged)) == 1


def test_identity_raster_is_removed_and_output_names_are_kept() -> None:
    g, b, x = graph_with_input((3, 4))
    e = b.emit("exp", [x])
    back = b.emit("transpose", [b.emit("transpose", [e])])  # two transposes compose to the identity
    g.outputs = [back]
    plain, merged = _merge(g)
    assert [n.op for n in merged.nodes] == ["exp"]
    assert merged.nodes[0].outputs == plain.outputs


def test_identity_raster_on_a_graph_input_stays_when_it_is_the_output() -> None:
    g, b, x = graph_with_input((3, 4))
    back = b.emit("transpose", [b.emit("transpose", [x])])
    g.outputs = [back]
    _, merged = _merge(g)
    assert len(merged.nodes) == 1  # an input cannot be renamed to the output's name


def test_raster_reading_a_constant_is_merged_through() -> None:
    g, b, x = graph_with_input((4, 3))
    w = b.const(np.arange(12, dtype=np.float32).reshape(3, 4))
    wt = b.emit("slice", [b.emit("transpose", [w])], starts=[1], ends=[3], axes=[1])
    g.outputs = [b.emit("matmul", [b.emit("reshape", [x], shape=[3, 4]), wt])]
    plain, merged = _merge(g)
    assert len(rasters(plain)) == 3
    assert len(rasters(merged)) == 2 and any(n.inputs == [w] for n in rasters(merged))


def test_fit_regions_refuses_past_the_budget() -> None:
    rng = np.random.default_rng(0)
    idx = rng.permutation(64).reshape(8, 8)
    assert fit_regions(np.zeros((8, 8), dtype=np.int64), idx, budget=4) is None
    sid, flat = raster_index_map([[0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 8]], 8)
    assert sid.tolist() == [0] * 8 and flat.tolist() == list(range(8))


def test_channel_shuffle_then_split_reads_both_branches_as_strided_lattices() -> None:
    # ShuffleNet: concat two branches, interleave their channels, split the result in halves.
    g, b, x = graph_with_input((1, 6, 3, 3))
    y = g.add_input("y", g.specs[x])
    c = b.emit("concat", [x, y], axis=1)
    shuffled = b.emit("reshape", [b.emit("transpose", [b.emit("reshape", [c], shape=[1, 2, 6, 3, 3])],
                                         perm=[0, 2, 1, 3, 4])], shape=[1, 12, 3, 3])
    g.outputs = [b.emit("slice", [shuffled], starts=[0], ends=[6], axes=[1]),
                 b.emit("slice", [shuffled], starts=[6], ends=[12], axes=[1])]
    plain, merged = _merge(g)
    assert len(rasters(plain)) == 6
    assert len(merged.nodes) == 2
    for node in merged.nodes:
        assert node.inputs == ["x", "y"] and len(node.attrs["regions"]) == 2


def _harmonic_stack(b, x, shifts):
    # A pitch tracker's harmonic stacking: the spectrum [1, T, F, 1] shifted down by each harmonic's bins
    # (a crop and a zero pad), the shifted copies concatenated along the last axis.
    shifted = [b.emit("pad", [x], pads=[[0, 0], [0, 0], [s, -s], [0, 0]], value=0.0) if s else x for s in shifts]
    return b.emit("concat", shifted, axis=3)


def test_concat_of_shifted_pads_merges_into_one_raster() -> None:
    g, b, x = graph_with_input((1, 7, 30, 1))
    g.outputs = [_harmonic_stack(b, x, [5, 0, 3, 8])]
    plain, merged = _merge(g)
    assert len(rasters(plain)) == 4
    assert len(merged.nodes) == 1
