"""ai.onnx.ml's numeric ops import as ordinary IR ops and match ONNX Runtime (scikit-learn style models)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import edgerun
from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx import from_onnx

ML = "ai.onnx.ml"


def _model(node, inputs, outputs, ml_opset=3):
    graph = helper.make_graph([node], "g", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)],
                             ir_version=8)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _check(model, feeds, input_shapes=None, backends=None):
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = edgerun.load(from_onnx(model, input_shapes=input_shapes), backends=backends).run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


RNG = np.random.default_rng(0)
X = RNG.standard_normal((6, 4)).astype(np.float32)


@pytest.mark.parametrize("norm", ["MAX", "L1", "L2"])
def test_normalizer(norm) -> None:
    node = helper.make_node("Normalizer", ["x"], ["y"], domain=ML, norm=norm)
    _check(_model(node, [_vi("x", [6, 4])], [_vi("y", [6, 4])]), {"x": X})


def test_scaler_binarizer_and_imputer() -> None:
    node = helper.make_node("Scaler", ["x"], ["y"], domain=ML, offset=[0.5, -1.0, 0.0, 2.0], scale=[2.0, 0.5, 3.0, -1.0])
    _check(_model(node, [_vi("x", [6, 4])], [_vi("y", [6, 4])]), {"x": X})
    node = helper.make_node("Binarizer", ["x"], ["y"], domain=ML, threshold=0.25)
    _check(_model(node, [_vi("x", [6, 4])], [_vi("y", [6, 4])]), {"x": X})
    holes = X.copy()
    holes[1, 2] = holes[4, 0] = np.nan
    node = helper.make_node("Imputer", ["x"], ["y"], domain=ML, imputed_value_floats=[9.0, 8.0, 7.0, 6.5],
                            replaced_value_float=float("nan"))
    _check(_model(node, [_vi("x", [6, 4])], [_vi("y", [6, 4])]), {"x": holes})


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_linear_regressor_two_targets(post) -> None:
    node = helper.make_node("LinearRegressor", ["x"], ["y"], domain=ML, targets=2, post_transform=post,
                            coefficients=RNG.standard_normal(8).tolist(), intercepts=[0.5, -0.25])
    _check(_model(node, [_vi("x", ["N", 4])], [_vi("y", ["N", 2])]), {"x": X}, {"x": (("N", 1, 16), 4)})


def test_array_feature_extractor_and_one_hot_encoder() -> None:
    node = helper.make_node("ArrayFeatureExtractor", ["x", "i"], ["y"], domain=ML)
    model = _model(node, [_vi("x", [6, 4]), _vi("i", [3], TensorProto.INT64)], [_vi("y", [6, 3])])
    _check(model, {"x": X, "i": np.int64([3, 0, 3])})
    node = helper.make_node("OneHotEncoder", ["x"], ["y"], domain=ML, cats_int64s=[1, 4, 7], zeros=1)
    model = _model(node, [_vi("x", [2, 3], TensorProto.INT64)], [_vi("y", [2, 3, 3])])
    _check(model, {"x": np.int64([[1, 7, 5], [4, 4, 1]])})


def _regressor(aggregate="SUM", base=(0.0, 0.0), missing=(0, 0, 0, 0)):
    """Two trees over 4 features, two targets; tree 0 a depth-2 tree, tree 1 a stump (LT, missing tracks true)."""
    return helper.make_node(
        "TreeEnsembleRegressor", ["x"], ["y"], domain=ML, n_targets=2, aggregate_function=aggregate,
        base_values=list(base),
        nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
        nodes_featureids=[0, 2, 0, 0, 0, 3, 0, 0], nodes_values=[0.1, -0.3, 0, 0, 0, 0.0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "BRANCH_GT", "LEAF", "LEAF", "LEAF", "BRANCH_LT", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 2, 0, 0, 0, 1, 0, 0], nodes_falsenodeids=[4, 3, 0, 0, 0, 2, 0, 0],
        nodes_missing_value_tracks_true=[*missing, 0, 1, 0, 0],
        target_treeids=[0, 0, 0, 0, 1, 1, 1], target_nodeids=[2, 3, 4, 4, 1, 2, 2],
        target_ids=[0, 0, 0, 1, 1, 0, 1], target_weights=[1.5, -2.0, 0.25, 3.0, 0.5, -1.0, 2.0])


@pytest.mark.parametrize("aggregate", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_ensemble_regressor(aggregate) -> None:
    x = X.copy()
    x[2, 3] = np.nan  # the stump's missing value goes to its true branch
    model = _model(_regressor(aggregate, base=(0.5, -0.5)), [_vi("x", ["N", 4])], [_vi("y", ["N", 2])], 1)
    _check(model, {"x": x}, {"x": (("N", 1, 64), 4)})
    _check(model, {"x": x}, {"x": (("N", 1, 64), 4)}, backends=["onnxruntime", "reference"])


def test_tree_ensemble_opset_5_with_every_comparison_and_a_set() -> None:
    modes = np.uint8([0, 1, 2, 3, 4, 5, 6])  # LEQ LT GTE GT EQ NEQ MEMBER, one tree each (leaves 2i, 2i+1)
    n = len(modes)
    node = helper.make_node(
        "TreeEnsemble", ["x"], ["y"], domain=ML, n_targets=3, aggregate_function=0, post_transform=0,
        nodes_featureids=[0, 1, 2, 3, 0, 1, 2], nodes_modes=numpy_helper.from_array(modes),
        nodes_splits=numpy_helper.from_array(np.float32([0.0, 0.5, -0.5, 1.0, 1.0, 0.0, 0.0])),
        membership_values=numpy_helper.from_array(np.float32([1.0, 2.0, np.nan])),
        nodes_truenodeids=[2 * i for i in range(n)], nodes_falsenodeids=[2 * i + 1 for i in range(n)],
        nodes_trueleafs=[1] * n, nodes_falseleafs=[1] * n, tree_roots=list(range(n)),
        leaf_targetids=[i % 3 for i in range(2 * n)],
        leaf_weights=numpy_helper.from_array(np.float32(np.arange(2 * n) - 5.5)))
    x = np.float32([[0, 0.5, -0.5, 1], [1, 2, 3, 4], [-1, -2, 2, 0], [2, 1, 1, 1]])
    _check(_model(node, [_vi("x", [4, 4])], [_vi("y", [4, 3])], 5), {"x": x})


def test_string_categories_are_refused_by_name() -> None:
    node = helper.make_node("OneHotEncoder", ["x"], ["y"], domain=ML, cats_strings=["a", "b"])
    model = _model(node, [_vi("x", [2], TensorProto.INT64)], [_vi("y", [2, 2])])
    with pytest.raises(UnsupportedOpError, match="string categories"):
        from_onnx(model)


@pytest.mark.parametrize("post", ["NONE", "LOGISTIC", "SOFTMAX"])
def test_linear_classifier_three_classes(post) -> None:
    node = helper.make_node("LinearClassifier", ["x"], ["label", "scores"], domain=ML, post_transform=post,
                            coefficients=RNG.standard_normal(12).tolist(), intercepts=[0.1, -0.2, 0.3],
                            classlabels_ints=[7, 3, 5])
    model = _model(node, [_vi("x", ["N", 4])], [_vi("label", ["N"], TensorProto.INT64), _vi("scores", ["N", 3])], 1)
    _check(model, {"x": X}, {"x": (("N", 1, 16), 4)})


def test_an_unsupported_ml_op_is_refused_naming_it() -> None:
    node = helper.make_node("SVMRegressor", ["x"], ["y"], domain=ML, coefficients=[1.0], support_vectors=[1.0] * 4,
                            n_supports=1, rho=[0.0])
    with pytest.raises(UnsupportedOpError, match=r"'SVMRegressor': no import handler for this ai\.onnx\.ml op"):
        from_onnx(_model(node, [_vi("x", [6, 4])], [_vi("y", [6, 1])]))


@pytest.mark.parametrize("post,base", [("NONE", []), ("SOFTMAX", [0.1, -0.2, 0.3]), ("LOGISTIC", [])])
def test_tree_ensemble_classifier_three_classes(post, base) -> None:
    """Two trees whose leaves weight some of three classes (negative weights: a class no leaf scores is left
    out of the argmax, so a sample whose scored classes are all negative does not pick it)."""
    node = helper.make_node(
        "TreeEnsembleClassifier", ["x"], ["label", "scores"], domain=ML, classlabels_int64s=[10, 20, 30],
        post_transform=post, **({"base_values": base} if base else {}),
        nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2],
        nodes_featureids=[0, 2, 0, 0, 0, 3, 0, 0], nodes_values=[0.1, -0.3, 0, 0, 0, 0.0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "BRANCH_GT", "LEAF", "LEAF", "LEAF", "BRANCH_LT", "LEAF", "LEAF"],
        nodes_truenodeids=[1, 2, 0, 0, 0, 1, 0, 0], nodes_falsenodeids=[4, 3, 0, 0, 0, 2, 0, 0],
        class_treeids=[0, 0, 0, 0, 1, 1, 1], class_nodeids=[2, 3, 4, 4, 1, 2, 2],
        class_ids=[0, 1, 2, 1, 1, 0, 2], class_weights=[-0.5, 0.25, 0.25, 0.5, -0.75, 0.125, 0.375])
    model = _model(node, [_vi("x", ["N", 4])], [_vi("label", ["N"], TensorProto.INT64), _vi("scores", ["N", 3])], 1)
    negative = np.float32([[0, 0, 0, -1], [0, 5, 0, -2]])  # leaves scoring only classes 0 and 1, both negative
    _check(model, {"x": np.concatenate([X, -X, negative])}, {"x": (("N", 1, 64), 4)})
