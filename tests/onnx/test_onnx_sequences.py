"""ONNX sequences and optionals resolve at import time into tensors (frontends/onnx/sequences.py).

Each model is checked against onnx.reference (ONNX Runtime for one), through from_onnx and the ONNX backend:
sequence inputs become one program input per element, sequence outputs come back as lists."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.onnx import ValueTemplate, from_onnx, import_onnx_graph
from edgerun.frontends.onnx.backend import EdgerunBackend
from edgerun.frontends.onnx.sequences import OUTPUT_LAYOUT_KEY, group_outputs
from edgerun.oracle import interpret
from tests.onnx.onnx_graphs import make_model, run_onnxruntime, value_info

RNG = np.random.default_rng(5)
FLOAT_SEQ = helper.make_sequence_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, None))


def _seq_info(name):
    return helper.make_value_info(name, FLOAT_SEQ)


def _same(got, want):
    assert type(got) is type(want) or (isinstance(want, np.ndarray) and isinstance(got, np.ndarray))
    if isinstance(want, list):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
    elif want is not None:
        assert got.shape == want.shape and got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_split_insert_erase_concat_within_one_graph():
    """A sequence made and consumed inside the graph: no sequence reaches the program's boundary."""
    nodes = [
        helper.make_node("SplitToSequence", ["x"], ["parts"], axis=1, keepdims=0),
        helper.make_node("SequenceErase", ["parts", "first"], ["rest"]),
        helper.make_node("SequenceInsert", ["rest", "y"], ["more"]),
        helper.make_node("SequenceLength", ["more"], ["n"]),
        helper.make_node("SequenceAt", ["more", "last"], ["tail"]),
        helper.make_node("ConcatFromSequence", ["more"], ["stacked"], axis=0, new_axis=1),
    ]
    inits = [helper.make_tensor("first", TensorProto.INT64, [], [0]),
             helper.make_tensor("last", TensorProto.INT64, [], [-1])]
    model = make_model(nodes, [value_info("x", [3, 4]), value_info("y", [3])],
                       [value_info("n", [], TensorProto.INT64), value_info("tail", [3]),
                        value_info("stacked", [4, 3])], inits)
    feeds = {"x": RNG.standard_normal((3, 4)).astype(np.float32), "y": RNG.standard_normal(3).astype(np.float32)}
    program = from_onnx(model)
    assert OUTPUT_LAYOUT_KEY not in program.metadata  # tensors only at the boundary
    got = interpret(program.graph, [feeds[n] for n in program.graph.inputs])
    for g, w in zip(got, run_onnxruntime(model, feeds)):
        _same(g, w)


def test_sequence_input_and_output_are_lists_of_tensors():
    nodes = [helper.make_node("SequenceInsert", ["seq", "t", "pos"], ["out"])]
    model = make_model(nodes, [_seq_info("seq"), value_info("t", [2]), value_info("pos", [], TensorProto.INT64)],
                       [_seq_info("out")])
    seq = [RNG.standard_normal(s).astype(np.float32) for s in [(3,), (1,), (4,)]]
    t = np.ones(2, np.float32)
    for pos in (0, 2, -1):
        feeds = {"seq": seq, "t": t, "pos": np.array(pos, np.int64)}
        want = ReferenceEvaluator(model).run(None, feeds)
        got = EdgerunBackend.prepare(model).run(feeds)
        _same(list(got), want)
    # from_onnx itself: the structure comes in input_shapes, the position (a graph input) is specialised per
    # value, and the output groups back by the layout in the program's metadata
    template = from_onnx(model, input_shapes={"seq": [(3,), (1,), (4,)]})
    assert isinstance(template, ValueTemplate) and template.value_inputs == ["pos"]
    flat = {"seq.0": seq[0], "seq.1": seq[1], "seq.2": seq[2], "t": t, "pos": np.array(1, np.int64)}
    program, _ = template.for_values(flat)
    assert program.graph.inputs == ["seq.0", "seq.1", "seq.2", "t"]
    out = group_outputs(interpret(program.graph, [flat[n] for n in program.graph.inputs]),
                        program.metadata[OUTPUT_LAYOUT_KEY])
    _same(out, ReferenceEvaluator(model).run(None, {"seq": seq, "t": t, "pos": np.array(1, np.int64)}))


def test_sequence_map_inlines_its_body_per_element():
    body = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "body",
                             [value_info("a", ["N"]), value_info("b", ["N"])], [value_info("c", ["N"])])
    model = make_model([helper.make_node("SequenceMap", ["xs", "w"], ["ys"], body=body)],
                       [_seq_info("xs"), value_info("w", [4])], [_seq_info("ys")])
    feeds = {"xs": [RNG.standard_normal(4).astype(np.float32) for _ in range(3)], "w": np.arange(4, dtype=np.float32)}
    _same(list(EdgerunBackend.prepare(model).run(feeds)), ReferenceEvaluator(model).run(None, feeds))


def test_optionals_present_and_empty():
    opt_type = helper.make_optional_type_proto(helper.make_tensor_type_proto(TensorProto.FLOAT, [2]))
    nodes = [helper.make_node("OptionalHasElement", ["o"], ["has"]),
             helper.make_node("Identity", ["o"], ["same"])]
    model = make_model(nodes, [helper.make_value_info("o", opt_type)],
                       [value_info("has", [], TensorProto.BOOL), helper.make_value_info("same", opt_type)], opset=18)
    rep = EdgerunBackend.prepare(model)
    for value in (np.array([1.0, 2.0], np.float32), None):  # onnx.reference cannot pass an empty one through
        has, same = rep.run({"o": value})
        assert has.dtype == np.bool_ and bool(has) == (value is not None)
        _same(same, value)


def test_loop_growing_a_sequence_unrolls_for_a_known_trip_count():
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT),
         helper.make_node("Reshape", ["f", "one"], ["f1"]),
         helper.make_node("SequenceInsert", ["s", "f1"], ["s_out"])],
        "body", [value_info("i", [], TensorProto.INT64), value_info("c", [], TensorProto.BOOL), _seq_info("s")],
        [value_info("c_out", [], TensorProto.BOOL), _seq_info("s_out")],
        initializer=[helper.make_tensor("one", TensorProto.INT64, [1], [1])])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"]),
             helper.make_node("Loop", ["trips", "go", "empty"], ["grown"], body=body),
             helper.make_node("ConcatFromSequence", ["grown"], ["y"], axis=0)]
    model = make_model(nodes, [value_info("trips", [], TensorProto.INT64)], [value_info("y", [None])],
                       [helper.make_tensor("go", TensorProto.BOOL, [], [True])])
    rep = EdgerunBackend.prepare(model)
    for trips in (3, 5):  # the trip count is a graph input: specialised per value (a ValueTemplate)
        feeds = {"trips": np.array(trips, np.int64)}
        _same(rep.run(feeds)[0], ReferenceEvaluator(model).run(None, feeds)[0])
    assert rep.value_inputs == ("trips",)


def test_loop_whose_body_slices_by_its_counter_is_unrolled():
    """A Slice start computed from the trip counter cannot be an IR loop body's static attribute: unrolled."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Add", ["i", "one"], ["end"]),
         helper.make_node("Unsqueeze", ["i", "zero"], ["start1"]),
         helper.make_node("Unsqueeze", ["end", "zero"], ["end1"]),
         helper.make_node("Slice", ["table", "start1", "end1"], ["row"]),
         helper.make_node("Add", ["acc", "row"], ["acc_out"]),
         helper.make_node("Identity", ["acc_out"], ["seen"])],
        "body", [value_info("i", [], TensorProto.INT64), value_info("c", [], TensorProto.BOOL),
                 value_info("acc", [1])],
        [value_info("c_out", [], TensorProto.BOOL), value_info("acc_out", [1]), value_info("seen", [1])],
        initializer=[helper.make_tensor("one", TensorProto.INT64, [], [1]),
                     helper.make_tensor("zero", TensorProto.INT64, [1], [0])])
    model = make_model([helper.make_node("Loop", ["trips", "go", "a"], ["total", "partial"], body=body)],
                       [value_info("a", [1])], [value_info("total", [1]), value_info("partial", [4, 1])],
                       [helper.make_tensor("trips", TensorProto.INT64, [], [4]),
                        helper.make_tensor("go", TensorProto.BOOL, [], [True]),
                        helper.make_tensor("table", TensorProto.FLOAT, [5], [1, 2, 3, 4, 5])])
    feeds = {"a": np.array([0.5], np.float32)}
    program = from_onnx(model)
    assert not any(n.op in ("scan", "while_loop") for n in program.graph.nodes)
    got = interpret(program.graph, [feeds["a"]])
    for g, w in zip(got, run_onnxruntime(model, feeds)):
        _same(g, w)


def test_a_position_computed_at_run_time_is_refused_naming_the_node():
    nodes = [helper.make_node("ReduceMax", ["p"], ["pos"], keepdims=0),
             helper.make_node("SequenceConstruct", ["a", "a"], ["s"]),
             helper.make_node("SequenceAt", ["s", "pos"], ["y"], name="pick")]
    model = make_model(nodes, [value_info("a", [2]), value_info("p", [3], TensorProto.INT64)],
                       [value_info("y", [2])])
    with pytest.raises(UnsupportedOpError, match=r"SequenceAt.*pick.*position") as info:
        import_onnx_graph(model)  # the position is computed at run time: refused, naming the node
    assert info.value.graph_inputs == ("p",)
    # from_onnx makes it a ValueTemplate: each call's value of p decides the position
    template = from_onnx(model)
    assert isinstance(template, ValueTemplate) and template.value_inputs == ["p"]
    a = np.array([1.0, 2.0], np.float32)
    program, _ = template.for_values({"a": a, "p": np.array([0, 1, 0], np.int64)})
    np.testing.assert_array_equal(interpret(program.graph, [a])[0], a)


def test_sequence_input_needs_its_structure():
    model = make_model([helper.make_node("Identity", ["s"], ["t"])], [_seq_info("s")], [_seq_info("t")])
    with pytest.raises(EdgerunError, match="input_shapes"):
        from_onnx(model)
