"""Data-dependent output sizes (NonZero, Compress, Unique, NonMaxSuppression): imported once, run in stages split
at each such node (ir/staging.py), matching ONNX Runtime on real graphs where the selection feeds more ops."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx_graphs import make_model as _model
from onnx_graphs import run_onnxruntime as _ort
from onnx_graphs import value_info as _vi

import edgerun
from edgerun.frontends.onnx import from_onnx
from edgerun.ir.graph import Graph
from edgerun.ir.specialize import ShapeBindingError
from edgerun.ir.staging import has_data_dependent, runtime_symbols, split_at_data_dependent
from edgerun.ir.symbolic import sym
from edgerun.ir.verifier import verify
from edgerun.oracle import interpret

BACKENDS = (["reference"], ["onnxruntime", "reference"])  # the stages around the node on either


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


def _select_rows_model():
    """Rows of x whose largest entry passes 0.5, through NonZero -> Gather, then a linear layer and ReLU."""
    weight = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["score"], axes=[1], keepdims=0),
        helper.make_node("Greater", ["score", "t"], ["mask"]),
        helper.make_node("NonZero", ["mask"], ["idx"]),
        helper.make_node("Squeeze", ["idx", "zero"], ["rows"]),
        helper.make_node("Gather", ["x", "rows"], ["picked"], axis=0),
        helper.make_node("MatMul", ["picked", "w"], ["mm"]),
        helper.make_node("Relu", ["mm"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.float32(0.5), "t"), numpy_helper.from_array(np.int64([0]), "zero"),
             numpy_helper.from_array(weight, "w")]
    return _model(nodes, [_vi("x", ["N", 8])], [_vi("y", ["K", 16]), _vi("rows", ["K"], TensorProto.INT64)], inits)


@pytest.mark.parametrize("backends", BACKENDS)
def test_nonzero_feeding_a_gather_matches_onnxruntime_at_every_count(backends, tmp_path) -> None:
    model = _select_rows_model()
    program = from_onnx(model, input_shapes={"x": (("N", 1, 64), 8)})
    count = next(s for s in program.graph.symbols if s != "N")
    assert program.graph.symbols[count] == (0, 64)  # bounded by the mask's largest size
    path = tmp_path / "select.edgerun"
    program.save(path)
    rng = np.random.default_rng(1)
    for loaded in (edgerun.load(program, backends=backends), edgerun.load(path, backends=backends)):
        for n in (1, 5, 33, 64):
            x = rng.standard_normal((n, 8)).astype(np.float32)
            _same(loaded.run({"x": x}), _ort(model, {"x": x}))
        nothing = -np.ones((4, 8), np.float32)  # no row passes: empty outputs, as ONNX Runtime gives
        got = loaded.run({"x": nothing})
        assert got[0].shape == (0, 16) and got[1].shape == (0,)
        _same(got, _ort(model, {"x": nothing}))


def test_two_data_dependent_nodes_in_a_chain_run_in_three_stages() -> None:
    """Compress keeps the positive entries, Unique (not sorted) dedupes them, and its counts are scaled."""
    nodes = [
        helper.make_node("Greater", ["x", "zero_f"], ["positive"]),
        helper.make_node("Compress", ["x", "positive"], ["kept"], axis=0),
        helper.make_node("Unique", ["kept"], ["values", "first", "inverse", "counts"], sorted=0),
        helper.make_node("Cast", ["counts"], ["counts_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["values", "counts_f"], ["weighted"]),
    ]
    inits = [numpy_helper.from_array(np.float32(0), "zero_f")]
    model = _model(nodes, [_vi("x", ["N"])], [_vi("weighted", ["U"]), _vi("inverse", ["K"], TensorProto.INT64),
                                              _vi("first", ["U"], TensorProto.INT64)], inits, opset=11)
    program = from_onnx(model, input_shapes={"x": (("N", 1, 100),)})
    assert len(runtime_symbols(program.graph)) == 2
    stages = split_at_data_dependent(program.graph)
    assert stages.node.op == "nonzero" and has_data_dependent(stages.suffix)
    rng = np.random.default_rng(2)
    for backends in BACKENDS:
        loaded = edgerun.load(program, backends=backends)
        for n in (1, 7, 100):
            x = rng.integers(-3, 4, n).astype(np.float32)
            _same(loaded.run({"x": x}), _ort(model, {"x": x}))
            _same(interpret(program.graph, {"x": x}), _ort(model, {"x": x}))


def test_non_max_suppression_feeding_a_gather_of_the_kept_boxes() -> None:
    nodes = [
        helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_min"], ["selected"]),
        helper.make_node("Gather", ["selected", "two"], ["box_index"], axis=1),
        helper.make_node("Squeeze", ["boxes", "zero"], ["boxes_0"]),
        helper.make_node("Gather", ["boxes_0", "box_index"], ["kept"], axis=0),
    ]
    inits = [numpy_helper.from_array(np.int64([3]), "max_out"), numpy_helper.from_array(np.float32([0.4]), "iou"),
             numpy_helper.from_array(np.float32([0.2]), "score_min"), numpy_helper.from_array(np.int64(2), "two"),
             numpy_helper.from_array(np.int64([0]), "zero")]
    model = _model(nodes, [_vi("boxes", [1, "B", 4]), _vi("scores", [1, 2, "B"])],
                   [_vi("selected", ["S", 3], TensorProto.INT64), _vi("kept", ["S", 4])], inits)
    program = from_onnx(model, input_shapes={"boxes": (1, ("B", 1, 50), 4)})
    loaded = edgerun.load(program, backends=["onnxruntime", "reference"])
    rng = np.random.default_rng(3)
    for b in (1, 6, 50):
        corner = rng.uniform(0, 1, (1, b, 2)).astype(np.float32)
        boxes = np.concatenate([corner, corner + rng.uniform(0.1, 0.5, (1, b, 2)).astype(np.float32)], axis=2)
        scores = rng.uniform(0, 1, (1, 2, b)).astype(np.float32)
        feeds = {"boxes": boxes, "scores": scores}
        _same(loaded.run(feeds), _ort(model, feeds))


def test_a_call_outside_the_input_bounds_names_the_input() -> None:
    program = from_onnx(_select_rows_model(), input_shapes={"x": (("N", 1, 64), 8)})
    loaded = edgerun.load(program)
    with pytest.raises(ShapeBindingError, match="input 'x' dimension 0 is 65"):
        loaded.run({"x": np.zeros((65, 8), np.float32)})


def test_staging_splits_into_verified_stages_and_the_extent_is_bound_from_an_input() -> None:
    program = from_onnx(_select_rows_model(), input_shapes={"x": (("N", 1, 64), 8)})
    (count,) = runtime_symbols(program.graph)
    stages = split_at_data_dependent(program.graph)
    for stage in (stages.prefix, stages.suffix):
        verify(stage)
    assert count not in stages.prefix.symbols and not has_data_dependent(stages.prefix)
    assert stages.suffix.inputs[:1] == ["x"] and stages.node.outputs[0] in stages.suffix.inputs
    assert stages.suffix.specs[stages.node.outputs[0]].shape == (1, sym(count))


def test_a_data_dependent_node_refuses_a_missing_extent_symbol() -> None:
    from edgerun.ir.builder import Builder
    from edgerun.ir.dtypes import DType
    from edgerun.ir.tensor_spec import TensorSpec
    graph = Graph()
    graph.add_input("x", TensorSpec((4,), DType.float32))
    with pytest.raises(ValueError, match="attr 'extent'"):
        Builder(graph).emit("nonzero", ["x"])


CONFORMANCE_CASES = ["test_nonzero_example", "test_compress_default_axis", "test_unique_not_sorted_without_axis",
                     "test_unique_sorted_with_axis_3d", "test_nonmaxsuppression_two_batches",
                     "test_nonmaxsuppression_center_point_box_format", "test_ai_onnx_ml_tree_ensemble_set_membership",
                     "test_ai_onnx_ml_array_feature_extractor"]


def test_data_dependent_and_ml_conformance_cases_count_and_pass_static_and_symbolic() -> None:
    from edgerun.frontends.onnx.categories import DESIGN_CATEGORIES, design_category
    from edgerun.frontends.onnx.conformance import edgerun_runner, node_cases, run_case, symbolic_runner

    assert "data-dependent-shape" not in DESIGN_CATEGORIES
    cases = {c.name: c for c in node_cases() if c.name in CONFORMANCE_CASES}
    assert sorted(cases) == sorted(CONFORMANCE_CASES)
    for case in cases.values():
        assert design_category(case.model) is None, case.name
        for runner in (edgerun_runner, symbolic_runner):
            result = run_case(case, runner)
            assert result.status == "pass", (case.name, result.detail)


def test_top_k_with_k_counted_from_the_data_matches_onnxruntime() -> None:
    """k = how many scores pass a threshold: a data-dependent top_k_dynamic (not a value template keyed on scores)."""
    nodes = [
        helper.make_node("Greater", ["scores", "t"], ["passing"]),
        helper.make_node("Cast", ["passing"], ["ones"], to=TensorProto.INT64),
        helper.make_node("ReduceSum", ["ones"], ["k"], keepdims=1),
        helper.make_node("TopK", ["scores", "k"], ["values", "index"], axis=0),
        helper.make_node("Mul", ["values", "two"], ["doubled"]),
    ]
    inits = [numpy_helper.from_array(np.float32(0.5), "t"), numpy_helper.from_array(np.float32(2), "two")]
    model = _model(nodes, [_vi("scores", ["N"])], [_vi("doubled", ["K"]), _vi("index", ["K"], TensorProto.INT64)],
                   inits)
    program = from_onnx(model, input_shapes={"scores": (("N", 1, 500),)})
    assert [n.op for n in program.graph.nodes if n.op == "top_k_dynamic"] == ["top_k_dynamic"]
    loaded = edgerun.load(program)
    rng = np.random.default_rng(5)
    for n in (1, 9, 500):
        scores = rng.integers(0, 8, n).astype(np.float32) / 8  # ties: the lower index comes first
        _same(loaded.run({"scores": scores}), _ort(model, {"scores": scores}))


def test_a_data_dependent_op_inside_a_control_flow_body_is_refused_naming_it() -> None:
    from edgerun.errors import UnsupportedOpError

    def branch(name, op):
        body = [helper.make_node(op, ["x"], [f"{name}_out"])]
        return helper.make_graph(body, name, [], [helper.make_tensor_value_info(f"{name}_out", TensorProto.INT64,
                                                                                 None)])

    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=branch("then", "NonZero"),
                              else_branch=branch("else", "NonZero"))]
    model = _model(nodes, [_vi("c", [], TensorProto.BOOL), _vi("x", [4])], [_vi("y", [1, "K"], TensorProto.INT64)])
    with pytest.raises(UnsupportedOpError, match=r"'NonZero'.*inside a control-flow body"):
        from_onnx(model)


def test_boolean_mask_indexing_exported_by_torch_matches_eager_and_onnxruntime() -> None:
    """`x[keep]` and `nonzero(keep)` as torch.onnx.export writes them: NonZero, Transpose, GatherND, twice."""
    import io

    import torch

    class Masked(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            keep = x.amax(dim=1) > 0.5
            return torch.relu(self.linear(x[keep])), torch.nonzero(keep).squeeze(1)

    torch.manual_seed(0)
    module = Masked().eval()
    buffer = io.BytesIO()
    torch.onnx.export(module, (torch.randn(6, 8),), buffer, input_names=["x"], output_names=["y", "rows"],
                      dynamic_axes={"x": {0: "N"}}, opset_version=17, dynamo=False)
    import onnx
    model = onnx.load_from_string(buffer.getvalue())
    assert [n.op_type for n in model.graph.node].count("NonZero") == 2
    loaded = edgerun.load(from_onnx(model, input_shapes={"x": (("N", 1, 256), 8)}))
    rng = np.random.default_rng(6)
    for n in (1, 6, 100, 256):
        x = rng.standard_normal((n, 8)).astype(np.float32)
        got = loaded.run({"x": x})
        _same(got, _ort(model, {"x": x}))
        with torch.no_grad():
            eager = [t.numpy() for t in module(torch.from_numpy(x))]
        for g, e in zip(got, eager):
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_interpret_runs_a_staged_graph_with_its_hook_seeing_every_node() -> None:
    program = from_onnx(_select_rows_model(), input_shapes={"x": (("N", 1, 64), 8)})
    seen: list[str] = []
    x = np.random.default_rng(8).standard_normal((10, 8)).astype(np.float32)
    got = interpret(program.graph, {"x": x}, hook=lambda node, args, outs: seen.append(node.op))
    _same(got, _ort(_select_rows_model(), {"x": x}))
    assert "nonzero" in seen and seen.index("nonzero") > 0 and len(seen) > seen.index("nonzero") + 1
