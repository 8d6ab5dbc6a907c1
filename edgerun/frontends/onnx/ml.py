"""The numeric ops of the ai.onnx.ml domain (classic ML: scikit-learn, XGBoost, LightGBM exports).

Each imports as ordinary IR ops with ONNX Runtime's semantics, so every backend can run them and the verifier
checks them like the rest: Binarizer, Scaler, Imputer are elementwise; Normalizer a reduction and a division
(ONNX Runtime's MAX: max(x), not max |x|); LinearRegressor a matmul; ArrayFeatureExtractor a gather;
OneHotEncoder a comparison against its categories; LinearClassifier a matmul and an argmax. Tree ensembles
(TreeEnsemble, opset 5; TreeEnsembleRegressor and TreeEnsembleClassifier, opsets 1 and 3) become a node
table walked in lockstep for every sample and tree: one step per level of the deepest tree, each a gather of
the current node's feature, threshold and children, then a gather of each leaf's weights per target and the
aggregate over trees. LabelEncoder (strings or numbers) is strings.py's; string class labels and OneHotEncoder's
string categories are refused by name (not imported yet: they would map onto label_encode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType

ML = "ai.onnx.ml"


def _floating(ctx: ImportContext, x: str) -> str:
    """x as float32 unless it is float32 or float64 already (the ML ops take integer features too)."""
    return x if ctx.b.dtype(x) in (DType.float32, DType.float64) else ctx.cast(x, DType.float32)


def _floats(node: OnnxNode, key: str) -> list[float]:
    return [float(v) for v in node.attr(key, []) or []]


def _array(node: OnnxNode, key: str, default: Any = None) -> np.ndarray:
    """A TENSOR (or list) attribute as a flat numpy array."""
    value = node.attr(key, default)
    if hasattr(value, "data_type"):
        from onnx import numpy_helper
        value = numpy_helper.to_array(value)
    return np.asarray(value if value is not None else []).reshape(-1)


@onnx_op(f"{ML}:Binarizer")
def binarizer(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    above = ctx.emit("gt", [x, ctx.scalar(node.float_attr("threshold", 0.0), x)])
    return [ctx.cast(above, ctx.b.dtype(x))]


@onnx_op(f"{ML}:Scaler")
def scaler(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """(x - offset) * scale per feature (one value broadcasts), in float32 as ONNX Runtime computes it."""
    x = ctx.cast(ctx.input(node, 0), DType.float32)
    offset = ctx.b.const(np.asarray(_floats(node, "offset") or [0.0], np.float32))
    scale = ctx.b.const(np.asarray(_floats(node, "scale") or [1.0], np.float32))
    return [ctx.emit("mul", [ctx.emit("sub", [x, offset]), scale])]


@onnx_op(f"{ML}:Imputer")
def imputer(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """Replace `replaced_value_*` (NaN by default for floats) by the imputed value of its feature."""
    x = ctx.input(node, 0)
    dtype = ctx.b.dtype(x)
    if dtype.is_float:
        values, replaced = _floats(node, "imputed_value_floats"), node.float_attr("replaced_value_float", 0.0)
    else:
        values, replaced = list(node.attr("imputed_value_int64s", []) or []), int(node.attr("replaced_value_int64", 0))
    if not values:
        raise node.refuse("Imputer without imputed values of its input's type")
    fill = ctx.b.const(np.asarray(values), dtype)
    hit = ctx.emit("ne", [x, x]) if dtype.is_float and np.isnan(replaced) else \
        ctx.emit("eq", [x, ctx.scalar(replaced, x)])
    return [ctx.emit("where", [hit, fill, x])]


@onnx_op(f"{ML}:Normalizer")
def normalizer(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """Each row (a 1-D input: the vector) in float32 divided by its max, L1 or L2 norm, as the spec's formulas
    and ONNX Runtime: MAX is max(x) itself, not of |x|, and a row whose norm is 0 stays as it is. (ONNX's
    Python reference takes max |x| and floors the norm at 1e-30; ONNX Runtime is what models run on.)"""
    x = ctx.cast(ctx.input(node, 0), DType.float32)
    axis = len(ctx.b.shape(x)) - 1
    if axis > 1:
        raise node.refuse(f"Normalizer of rank {axis + 1} (1-D and 2-D inputs are defined)")
    norm = str(node.attr("norm", "MAX"))
    if norm == "MAX":
        size = ctx.emit("reduce_max", [x], axes=[axis], keepdims=True)
    elif norm == "L1":
        size = ctx.emit("reduce_sum", [ctx.emit("abs", [x])], axes=[axis], keepdims=True)
    elif norm == "L2":
        size = ctx.emit("sqrt", [ctx.emit("reduce_sum", [ctx.emit("mul", [x, x])], axes=[axis], keepdims=True)])
    else:
        raise node.refuse(f"norm {norm!r} (MAX, L1 and L2 are defined)")
    zero = ctx.emit("eq", [size, ctx.scalar(0, x)])
    safe = ctx.emit("where", [zero, ctx.scalar(1, x), size])
    return [ctx.emit("where", [zero, x, ctx.emit("div", [x, safe])])]


@onnx_op(f"{ML}:LinearRegressor")
def linear_regressor(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.cast(ctx.input(node, 0), DType.float32)
    if len(ctx.b.shape(x)) == 1:
        x = ctx.emit("reshape", [x], shape=[1, -1])
    targets = int(node.attr("targets", 1))
    coefficients = np.asarray(_floats(node, "coefficients"), np.float32).reshape(targets, -1).T
    score = ctx.emit("matmul", [x, ctx.b.const(np.ascontiguousarray(coefficients))])
    intercepts = _floats(node, "intercepts")
    if intercepts:
        score = ctx.emit("add", [score, ctx.b.const(np.asarray(intercepts, np.float32))])
    return [_post_transform(ctx, node, score, str(node.attr("post_transform", "NONE")))]


@onnx_op(f"{ML}:LinearClassifier")
def linear_classifier(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """Scores x @ coefficients^T + intercepts, the label of the first highest score (before the post
    transform, as ONNX Runtime picks it). Integer labels and two or more classes; a one-column binary model
    (ONNX Runtime synthesises its second column) and string labels are refused."""
    labels = list(node.attr("classlabels_ints", []) or [])
    if node.attr("classlabels_strings"):
        raise node.refuse("string class labels (not imported)")
    intercepts = _floats(node, "intercepts")
    classes = len(intercepts)
    if classes < 2 or len(labels) != classes:
        raise node.refuse(f"{classes} score column(s) for {len(labels)} integer labels (two or more classes, one "
                          "label each, are supported)")
    x = ctx.cast(ctx.input(node, 0), DType.float32)
    if len(ctx.b.shape(x)) == 1:
        x = ctx.emit("reshape", [x], shape=[1, -1])
    coefficients = np.asarray(_floats(node, "coefficients"), np.float32).reshape(classes, -1).T
    scores = ctx.emit("add", [ctx.emit("matmul", [x, ctx.b.const(np.ascontiguousarray(coefficients))]),
                              ctx.b.const(np.asarray(intercepts, np.float32))])
    best = ctx.emit("argmax", [scores], axis=1, keepdims=False)
    label = ctx.emit("gather", [ctx.b.const(np.asarray(labels, np.int64)), best], axis=0)
    return [label, _post_transform(ctx, node, scores, str(node.attr("post_transform", "NONE")))]


@onnx_op(f"{ML}:ArrayFeatureExtractor")
def array_feature_extractor(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """The last axis gathered at the (flattened) indices; 1-D data gives one row, as ONNX Runtime does."""
    x, index = ctx.input(node, 0), ctx.input(node, 1)
    shape = ctx.b.shape(x)
    if len(shape) == 1:
        x = ctx.emit("reshape", [x], shape=[1, shape[0]])
    flat = ctx.emit("reshape", [index], shape=[-1])
    return [ctx.emit("gather", [x, flat], axis=len(ctx.b.shape(x)) - 1)]


@onnx_op(f"{ML}:OneHotEncoder")
def one_hot_encoder(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """float32 [..., categories]: 1 where the value is the category. Unknown values give a zero row."""
    cats = list(node.attr("cats_int64s", []) or [])
    if not cats:
        raise node.refuse("OneHotEncoder of string categories (not imported)")
    if not int(node.attr("zeros", 1)):
        raise node.refuse("zeros=0 (fail on an unknown category) is a run-time error, not a value")
    x = ctx.input(node, 0)
    dtype = ctx.b.dtype(x)
    values = ctx.b.const(np.asarray(cats, np.float64 if dtype.is_float else np.int64), dtype)
    shape = ctx.b.shape(x)
    hit = ctx.emit("eq", [ctx.emit("reshape", [x], shape=[*shape, 1]), values])
    return [ctx.cast(hit, DType.float32)]


def _post_transform(ctx: ImportContext, node: OnnxNode, score: str, kind: str) -> str:
    if kind == "NONE":
        return score
    if kind == "LOGISTIC":
        return ctx.emit("sigmoid", [score])
    if kind == "SOFTMAX":
        return ctx.emit("softmax", [score], axis=-1)
    raise node.refuse(f"post_transform {kind} (NONE, LOGISTIC and SOFTMAX are supported)")


# ---- tree ensembles ---------------------------------------------------------------------------------------

MODES = ("BRANCH_LEQ", "BRANCH_LT", "BRANCH_GTE", "BRANCH_GT", "BRANCH_EQ", "BRANCH_NEQ", "BRANCH_MEMBER")
_COMPARE = {"BRANCH_LEQ": "le", "BRANCH_LT": "lt", "BRANCH_GTE": "ge", "BRANCH_GT": "gt", "BRANCH_EQ": "eq",
            "BRANCH_NEQ": "ne"}


@dataclass
class Forest:
    """Every tree's decision nodes in one table; a child or root index >= len(feature) is leaf (index - len)."""

    feature: list[int] = field(default_factory=list)
    threshold: list[float] = field(default_factory=list)
    mode: list[str] = field(default_factory=list)
    members: list[list[float]] = field(default_factory=list)  # BRANCH_MEMBER's set, else []
    missing_true: list[bool] = field(default_factory=list)  # a NaN feature takes the true branch
    true_next: list[int] = field(default_factory=list)
    false_next: list[int] = field(default_factory=list)
    roots: list[int] = field(default_factory=list)
    leaf_weights: list[dict[int, list[float]]] = field(default_factory=list)  # per leaf: target -> weights


def _depth(forest: Forest, node: OnnxNode) -> int:
    """Levels of decision nodes on the longest root-to-leaf path (refusing a cycle)."""
    internal = len(forest.feature)
    memo: dict[int, int] = {}

    def depth(i: int, seen: frozenset[int]) -> int:
        if i >= internal:
            return 0
        if i in seen:
            raise node.refuse("the trees' node links form a cycle")
        if i not in memo:
            memo[i] = 1 + max(depth(forest.true_next[i], seen | {i}), depth(forest.false_next[i], seen | {i}))
        return memo[i]
    return max((depth(r, frozenset()) for r in forest.roots), default=0)


def _walk(ctx: ImportContext, node: OnnxNode, x: str, forest: Forest) -> str:
    """int64 [N, trees]: the leaf each sample reaches in each tree."""
    internal, trees = len(forest.feature), len(forest.roots)
    dtype = ctx.b.dtype(x)
    n, features = ctx.b.shape(x)
    if not isinstance(features, int):
        raise node.refuse_at_bounds(f"a symbolic feature axis ({features}): the trees index features by number, "
                                    "pin it in input_shapes=")
    current = ctx.b.const(np.asarray(forest.roots, np.int64).reshape(1, trees))
    if internal:
        current = ctx.emit("expand", [current], shape=[n, trees])
    table = {name: ctx.b.const(np.asarray(values, np.int64)) for name, values in
             (("feature", forest.feature), ("true", forest.true_next), ("false", forest.false_next))}
    threshold = ctx.b.const(np.asarray(forest.threshold), dtype)
    x_rows = ctx.emit("reshape", [x], shape=[n, 1, features])
    feature_ids = ctx.b.const(np.arange(features, dtype=np.int64))
    member_width = max((len(m) for m in forest.members), default=0)
    members = None
    if member_width:
        padded = np.full((internal, member_width), np.nan)
        for i, m in enumerate(forest.members):
            padded[i, :len(m)] = m
        members = ctx.b.const(padded, dtype)
    for _ in range(_depth(forest, node)):
        at = ctx.emit("minimum", [current, ctx.b.const(np.int64(internal - 1))])  # leaves read a valid slot
        feature = ctx.emit("gather", [table["feature"], at], axis=0)  # [N, T]
        # The feature's value per sample and tree: a one-hot select over the features (exact; any batch size).
        pick = ctx.emit("eq", [ctx.emit("reshape", [feature], shape=[n, trees, 1]), feature_ids])
        value = ctx.emit("reduce_sum", [ctx.emit("where", [pick, x_rows, ctx.scalar(0, x)])], axes=[2],
                         keepdims=False)
        split = ctx.emit("gather", [threshold, at], axis=0)
        go_true = ""
        for mode in sorted(set(forest.mode)):
            if mode == "BRANCH_MEMBER":
                assert members is not None
                inside = ctx.emit("eq", [ctx.emit("reshape", [value], shape=[n, trees, 1]),
                                         ctx.emit("gather", [members, at], axis=0)])
                test = ctx.emit("reduce_max", [ctx.cast(inside, DType.float32)], axes=[2], keepdims=False)
                test = ctx.emit("gt", [test, ctx.b.const(np.float32(0))])
            else:
                test = ctx.emit(_COMPARE[mode], [value, split])
            if len(set(forest.mode)) > 1:
                is_mode = ctx.b.const(np.asarray([m == mode for m in forest.mode]))
                test = ctx.emit("logical_and", [test, ctx.emit("gather", [is_mode, at], axis=0)])
            go_true = test if not go_true else ctx.emit("logical_or", [go_true, test])
        if any(forest.missing_true):
            tracks = ctx.emit("gather", [ctx.b.const(np.asarray(forest.missing_true)), at], axis=0)
            go_true = ctx.emit("logical_or", [go_true, ctx.emit("logical_and", [tracks, ctx.emit("ne", [value, value])])])
        step = ctx.emit("where", [go_true, ctx.emit("gather", [table["true"], at], axis=0),
                                  ctx.emit("gather", [table["false"], at], axis=0)])
        is_leaf = ctx.emit("ge", [current, ctx.b.const(np.int64(internal))])
        current = ctx.emit("where", [is_leaf, current, step])
    return ctx.emit("sub", [current, ctx.b.const(np.int64(internal))])


def _aggregate(ctx: ImportContext, node: OnnxNode, leaves: str, forest: Forest, targets: int, how: str,
               dtype: DType, base: Sequence[float]) -> str:
    """[N, targets]: each tree's leaf weights per target, combined over the trees by SUM, AVERAGE, MIN or MAX."""
    trees = len(forest.roots)
    info = np.finfo(dtype.np)
    empty = {"SUM": 0.0, "AVERAGE": 0.0, "MIN": float(info.max), "MAX": float(info.min)}[how]
    table = np.full((len(forest.leaf_weights), targets), empty, dtype.np)
    for leaf, weights in enumerate(forest.leaf_weights):
        for target, ws in weights.items():
            if not 0 <= target < targets:
                raise node.refuse(f"leaf target id {target} outside [0, {targets})")
            if how in ("SUM", "AVERAGE"):
                table[leaf, target] = np.sum(np.asarray(ws, dtype.np))
            else:
                table[leaf, target] = (min if how == "MIN" else max)([empty, *ws])
    per_tree = ctx.emit("gather", [ctx.b.const(table, dtype), leaves], axis=0)  # [N, T, targets]
    reduce = {"SUM": "reduce_sum", "AVERAGE": "reduce_sum", "MIN": "reduce_min", "MAX": "reduce_max"}[how]
    out = ctx.emit(reduce, [per_tree], axes=[1], keepdims=False)
    if how == "AVERAGE":
        out = ctx.emit("div", [out, ctx.b.const(np.asarray(trees, dtype.np))])
    if base:
        out = ctx.emit("add", [out, ctx.b.const(np.asarray(base, dtype.np))])
    return out


@onnx_op(f"{ML}:TreeEnsemble")
def tree_ensemble(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """ai.onnx.ml opset 5: node tables with leaves apart (`nodes_trueleafs`), splits as a tensor."""
    x = ctx.input(node, 0)
    if ctx.b.dtype(x) not in (DType.float32, DType.float64, DType.float16):
        raise node.refuse(f"TreeEnsemble of {ctx.b.dtype(x).value}")
    modes = [MODES[int(m)] for m in _array(node, "nodes_modes")]
    splits = _array(node, "nodes_splits").astype(np.float64)
    members = iter(_array(node, "membership_values", []).astype(np.float64))
    true_ids, false_ids = list(node.attr("nodes_truenodeids")), list(node.attr("nodes_falsenodeids"))
    true_leaf, false_leaf = list(node.attr("nodes_trueleafs")), list(node.attr("nodes_falseleafs"))
    internal = len(modes)
    missing = list(node.attr("nodes_missing_value_tracks_true", []) or [0] * internal)
    forest = Forest(feature=[int(f) for f in node.attr("nodes_featureids")], threshold=list(splits), mode=modes,
                    missing_true=[bool(m) for m in missing])
    for i, mode in enumerate(modes):
        found: list[float] = []
        if mode == "BRANCH_MEMBER":
            for value in members:
                if np.isnan(value):
                    break
                found.append(float(value))
        forest.members.append(found)
        forest.true_next.append(int(true_ids[i]) + (internal if true_leaf[i] else 0))
        forest.false_next.append(int(false_ids[i]) + (internal if false_leaf[i] else 0))
    for root in node.attr("tree_roots"):
        root = int(root)
        single_leaf = true_leaf[root] and false_leaf[root] and true_ids[root] == false_ids[root]
        forest.roots.append(internal + int(true_ids[root]) if single_leaf else root)
    trees = len(forest.roots)
    for target, weight in zip(node.attr("leaf_targetids"), _array(node, "leaf_weights")):
        forest.leaf_weights.append({int(target): [float(weight)]})
    how = ("AVERAGE", "SUM", "MIN", "MAX")[int(node.attr("aggregate_function", 1))]
    if how == "AVERAGE":  # ONNX adds weight / trees per tree
        forest.leaf_weights = [{t: [w / trees for w in ws] for t, ws in lw.items()} for lw in forest.leaf_weights]
        how = "SUM"
    dtype = ctx.b.dtype(x)
    out = _aggregate(ctx, node, _walk(ctx, node, x, forest), forest, int(node.attr("n_targets")), how, dtype, [])
    kind = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")[int(node.attr("post_transform", 0))]
    return [_post_transform(ctx, node, out, kind)]


@onnx_op(f"{ML}:TreeEnsembleRegressor")
def tree_ensemble_regressor(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """ai.onnx.ml opsets 1 and 3: one row per node (tree id, node id, mode string), leaves marked LEAF, weights
    per (tree, leaf, target). Computed in float32, as ONNX Runtime does for float input."""
    if node.attr("nodes_values_as_tensor") is not None or node.attr("target_weights_as_tensor") is not None:
        raise node.refuse("double-precision tree tables (*_as_tensor)")
    x = ctx.cast(ctx.input(node, 0), DType.float32)
    if len(ctx.b.shape(x)) == 1:
        x = ctx.emit("reshape", [x], shape=[1, -1])
    forest = _regressor_forest(node)
    out = _aggregate(ctx, node, _walk(ctx, node, x, forest), forest, int(node.attr("n_targets", 1)),
                     str(node.attr("aggregate_function", "SUM")), DType.float32, _floats(node, "base_values"))
    return [_post_transform(ctx, node, out, str(node.attr("post_transform", "NONE")))]


@onnx_op(f"{ML}:TreeEnsembleClassifier")
def tree_ensemble_classifier(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """Three or more classes with integer labels: each class's score is the sum of the weights the sample's
    leaves give it, plus its base value; the label is that of the highest score among the classes some leaf
    (or a base value) scored, first on ties (ONNX Runtime's rule); then the post transform. The binary case
    (ONNX Runtime's special rules for one or two score columns) and string labels are refused."""
    labels = list(node.attr("classlabels_int64s", []) or [])
    if node.attr("classlabels_strings"):
        raise node.refuse("string class labels (not imported)")
    if len(labels) < 3:
        raise node.refuse(f"{len(labels)} classes (three or more are supported: the binary case has special rules)")
    if node.attr("nodes_values_as_tensor") is not None or node.attr("class_weights_as_tensor") is not None:
        raise node.refuse("double-precision tree tables (*_as_tensor)")
    x = ctx.cast(ctx.input(node, 0), DType.float32)
    if len(ctx.b.shape(x)) == 1:
        x = ctx.emit("reshape", [x], shape=[1, -1])
    forest = _regressor_forest(node, "class")
    classes = len(labels)
    base = _floats(node, "base_values")
    leaves = _walk(ctx, node, x, forest)
    scores = _aggregate(ctx, node, leaves, forest, classes, "SUM", DType.float32, base)
    if base:
        ranked = scores
    else:  # a class no reached leaf scores takes no part in the argmax
        scored = np.zeros((len(forest.leaf_weights), classes), bool)
        for leaf, weights in enumerate(forest.leaf_weights):
            scored[leaf, list(weights)] = True
        hit = ctx.emit("reduce_max", [ctx.emit("gather", [ctx.b.const(scored.astype(np.float32)), leaves], axis=0)],
                       axes=[1], keepdims=False)
        ranked = ctx.emit("where", [ctx.emit("gt", [hit, ctx.b.const(np.float32(0))]), scores,
                                    ctx.b.const(np.float32(-np.inf))])
    best = ctx.emit("argmax", [ranked], axis=1, keepdims=False)
    label = ctx.emit("gather", [ctx.b.const(np.asarray(labels, np.int64)), best], axis=0)
    return [label, _post_transform(ctx, node, scores, str(node.attr("post_transform", "NONE")))]


def _regressor_forest(node: OnnxNode, weights: str = "target") -> Forest:
    """The forest of TreeEnsembleRegressor (leaf weights `target_*`) or TreeEnsembleClassifier (`class_*`)."""
    tree_ids, node_ids = list(node.attr("nodes_treeids")), list(node.attr("nodes_nodeids"))
    modes = [m.decode() if isinstance(m, bytes) else str(m) for m in node.attr("nodes_modes")]  # STRINGS
    keys = list(zip(tree_ids, node_ids))
    decisions = [k for k, m in zip(keys, modes) if m != "LEAF"]
    leaves = [k for k, m in zip(keys, modes) if m == "LEAF"]
    if any(m not in MODES and m != "LEAF" for m in modes) or "BRANCH_MEMBER" in modes:
        raise node.refuse(f"node modes {sorted(set(modes) - {'LEAF'})} (the BRANCH_* comparisons are supported)")
    slot = {k: i for i, k in enumerate(decisions)} | {k: len(decisions) + i for i, k in enumerate(leaves)}
    row = {k: i for i, k in enumerate(keys)}
    missing = list(node.attr("nodes_missing_value_tracks_true", []) or [0] * len(keys))
    forest = Forest()
    children: set[tuple[int, int]] = set()
    for key in decisions:
        i = row[key]
        t, f = (key[0], int(node.attr("nodes_truenodeids")[i])), (key[0], int(node.attr("nodes_falsenodeids")[i]))
        if t not in slot or f not in slot:
            raise node.refuse(f"tree {key[0]} node {key[1]} links to a node that does not exist")
        children |= {t, f}
        forest.feature.append(int(node.attr("nodes_featureids")[i]))
        forest.threshold.append(float(np.float32(node.attr("nodes_values")[i])))
        forest.mode.append(modes[i])
        forest.members.append([])
        forest.missing_true.append(bool(missing[i]))
        forest.true_next.append(slot[t])
        forest.false_next.append(slot[f])
    for tree in dict.fromkeys(tree_ids):
        roots = [k for k in keys if k[0] == tree and k not in children]
        if len(roots) != 1:
            raise node.refuse(f"tree {tree} has {len(roots)} roots")
        forest.roots.append(slot[roots[0]])
    forest.leaf_weights = [{} for _ in leaves]
    for tree, nid, target, weight in zip(node.attr(f"{weights}_treeids"), node.attr(f"{weights}_nodeids"),
                                         node.attr(f"{weights}_ids"), node.attr(f"{weights}_weights")):
        key = (tree, nid)
        if key not in slot or slot[key] < len(decisions):
            raise node.refuse(f"a target weight names tree {tree} node {nid}, which is not a leaf")
        forest.leaf_weights[slot[key] - len(decisions)].setdefault(int(target), []).append(float(np.float32(weight)))
    return forest

