"""Composites survive until placement: a backend claims the ones it runs whole, the rest are lowered after.

MiniLM's program keeps layer_norm, gelu and softmax; on ONNX Runtime they become one ONNX node each, with
no decomposition to reassemble; placed on the reference instead, the same nodes are lowered there.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

pytest.importorskip("onnxruntime")

from edgerun.backends.onnxruntime import build_model
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.tensor_spec import TensorSpec
from edgerun.oracle import interpret
from edgerun.passes.decompose_pass import PROGRAM_COMPOSITES
from edgerun.runtime import load

RNG = np.random.default_rng(11)


def onnx_ops_of(loaded: object) -> Counter[str]:
    counts: Counter[str] = Counter()
    for part, compiled in zip(loaded.partitions, loaded.parts.compiled):  # type: ignore[attr-defined]
        if part.backend == "onnxruntime":
            model, _ = build_model(compiled.graph)
            counts.update(n.op_type for n in model.graph.node)
    return counts


def test_minilm_onnxruntime_partition_has_layer_norm_gelu_softmax_as_single_nodes() -> None:
    pytest.importorskip("torch")
    from edgerun import zoo
    from edgerun.frontends.torch import export

    spec = zoo.get("minilm_l6")
    args = spec.example_inputs()
    program = export(spec.build(), args)
    kept = program.graph.op_counts()
    assert kept["layer_norm"] and kept["gelu"] and kept["softmax"]  # the program file keeps them
    loaded = load(program, backends=["onnxruntime"])
    ops = onnx_ops_of(loaded)
    assert ops["LayerNormalization"] == kept["layer_norm"]
    assert ops["Gelu"] == kept["gelu"]
    assert ops["Softmax"] == kept["softmax"]
    assert not ops["Erf"] and not ops["ReduceMean"] and not ops["Exp"]  # nothing decomposed reached ORT
    inputs = [a.numpy() for a in args]
    np.testing.assert_allclose(loaded.run(inputs)[0], interpret(program.graph, inputs)[0], rtol=1e-4, atol=1e-4)


def block() -> Graph:
    g = Graph()
    b = Builder(g)
    x = g.add_input("x", TensorSpec((2, 4, 16), DType.float32))
    w = b.const(RNG.standard_normal((16, 16)).astype(np.float32))
    h = b.emit("layer_norm", [b.emit("matmul", [x, w])], normalized_ndim=1)
    g.outputs = [b.emit("softmax", [b.emit("gelu", [h])], axis=-1)]
    return g


def test_a_composite_placed_on_the_reference_is_lowered_there() -> None:
    g = block()
    x = RNG.standard_normal((2, 4, 16)).astype(np.float32)
    want = interpret(g, [x])[0]
    softmax = next(n.name for n in g.nodes if n.op == "softmax")
    loaded = load(g, backends=["onnxruntime"], placement={softmax: "reference"})
    ops = onnx_ops_of(loaded)
    assert ops["LayerNormalization"] == 1 and ops["Gelu"] == 1 and not ops["Softmax"]
    reference_ops = {n.op for p in loaded.partitions if p.backend == "reference" for n in p.nodes}
    assert "softmax" not in reference_ops and {"exp", "reduce_sum"} <= reference_ops  # lowered after placement
    np.testing.assert_allclose(loaded.run([x])[0], want, rtol=1e-5, atol=1e-6)


def test_without_a_claiming_backend_everything_is_lowered_before_placement() -> None:
    loaded = load(block(), backends=["reference"])
    assert not {n.op for n in loaded.graph.nodes} & PROGRAM_COMPOSITES


def test_onnx_clip_with_constant_bounds_reaches_ort_as_one_clip() -> None:
    # Imported as the clamp composite (not max then min), so ORT gets Clip and can fuse it into the Conv.
    import onnx
    from onnx import helper, numpy_helper

    from edgerun.frontends.onnx import from_onnx

    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Clip", ["c", "lo", "hi"], ["y"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
             numpy_helper.from_array(np.array(6.0, np.float32), "hi")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4, 8, 8])], inits)
    program = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert program.graph.op_counts()["clamp"] == 1
    loaded = load(program, backends=["onnxruntime"])
    ops = onnx_ops_of(loaded)
    assert ops["Clip"] == 1 and not ops["Max"] and not ops["Min"]
    x = RNG.standard_normal((1, 3, 8, 8)).astype(np.float32)
    np.testing.assert_allclose(loaded.run([x])[0], interpret(program.graph, [x])[0], rtol=1e-5, atol=1e-5)
