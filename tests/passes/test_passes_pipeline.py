"""The default pipeline end to end on a small CNN + attention graph, and the records it leaves for metadata."""

from __future__ import annotations

import json

import numpy as np
from passes_testkit import assert_same_outputs, graph_with_input

from edgerun.ir.graph import Graph
from edgerun.passes import (
    METADATA_KEY,
    PassRecord,
    default_pipeline,
    format_pass_table,
    optimize,
    records_from_json,
    records_to_json,
)

RNG = np.random.default_rng(1)


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) * 0.3).astype(np.float32)


def _small_model() -> Graph:
    g, b, x = graph_with_input((1, 3, 8, 8))
    y = b.emit("conv2d", [x, b.const(_w(8, 3, 3, 3)), b.const(_w(8))], padding=[1, 1, 1, 1])
    stats = [b.const(_w(8)), b.const(_w(8)), b.const(_w(8)), b.const(np.abs(_w(8)) + 0.5)]
    y = b.emit("relu", [b.emit("batch_norm", [y, *stats])])
    y = b.emit("conv2d", [y, b.const(_w(8, 1, 3, 3))], padding=[1, 1, 1, 1], groups=8)
    y = b.emit("clamp", [b.emit("batch_norm", [y, *stats])], min=0.0, max=6.0)
    tokens = b.emit("transpose", [b.emit("flatten", [y], start=2)], perm=[0, 2, 1])  # [1, 64, 8]
    heads = b.emit("transpose", [b.emit("reshape", [tokens], shape=[1, 64, 2, 4])], perm=[0, 2, 1, 3])
    att = b.emit("scaled_dot_product_attention", [heads, heads, heads])
    merged = b.emit("reshape", [b.emit("transpose", [att], perm=[0, 2, 1, 3])], shape=[1, 64, 8])
    z = b.emit("layer_norm", [b.emit("add", [tokens, merged]), b.const(_w(8)), b.const(_w(8))])
    g.outputs = [b.emit("linear", [b.emit("reduce_mean", [z], axes=[1]), b.const(_w(5, 8)), b.const(_w(5))])]
    return g


def test_default_pipeline_reduces_ops_and_keeps_outputs() -> None:
    graph = _small_model()
    original = graph.copy()
    optimized, records = optimize(graph)
    assert graph.nodes == original.nodes  # optimize works on a copy
    assert [r.name for r in records] == [p.name for p in default_pipeline()]
    decomposed_count = sum(records[0].ops_after.values())
    assert sum(records[-1].ops_after.values()) < decomposed_count
    consumers = optimized.consumers()
    convs = [n for n in optimized.nodes if n.op == "conv2d"]
    # Both batch norms went into their convs: each conv feeds its activation directly.
    assert len(convs) == 2 and all([u.op for u in consumers[c.outputs[0]]] in (["relu"], ["clamp"]) for c in convs)
    assert_same_outputs(original, optimized, rtol=1e-5)
    assert optimized.weight_bytes() <= original.weight_bytes()


def test_records_survive_json_and_read_back() -> None:
    _, records = optimize(_small_model())
    data = json.loads(json.dumps({METADATA_KEY: records_to_json(records)}))[METADATA_KEY]
    back = records_from_json(data)
    assert [(r.name, r.ops_before, r.ops_after) for r in back] == \
        [(r.name, r.ops_before, r.ops_after) for r in records]


def test_records_from_json_rejects_malformed_data() -> None:
    import pytest

    for bad in ({"name": "x"}, [{"name": "x", "ops_before": {"add": "1"}, "ops_after": {}}], [3]):
        with pytest.raises(ValueError):
            records_from_json(bad)


def test_pass_table_lists_each_pass_with_its_counts() -> None:
    records = [PassRecord("decompose", {"relu": 2}, {"maximum": 2}, 0.001),
               PassRecord("dead_code", {"maximum": 2}, {"maximum": 2}, 0.0)]
    table = format_pass_table(records).splitlines()
    assert table[0].split()[:3] == ["pass", "ops", "before"]
    assert table[1].split()[:5] == ["decompose", "2", "2", "maximum+2", "relu-2"]
    assert table[2].split()[:4] == ["dead_code", "2", "2", "-"]


def test_output_names_survive_when_outputs_decompose_to_inputs_or_constants() -> None:
    g, b, x = graph_with_input((2, 3))
    same = b.emit("reshape", [x], shape=[2, 3])  # decomposes to x itself
    again = b.emit("transpose", [x], perm=[0, 1])  # so does this: x is listed twice
    folded = b.emit("reshape", [b.const(np.ones(6, dtype=np.float32))], shape=[2, 3])
    weight = b.emit("reshape", [b.const(np.arange(6, dtype=np.float32).reshape(2, 3))], shape=[2, 3])
    g.outputs = [same, again, b.emit("add", [folded, x]), weight]
    optimized, _ = optimize(g)
    assert optimized.outputs == g.outputs
    assert_same_outputs(g, optimized)
