"""String tensors end to end: ONNX's string ops import, run on the reference exactly as ONNX's own reference
implementation (onnx.reference.ReferenceEvaluator) computes them, stay on the reference when other backends
are offered, and a non-string fed to a string input is a clear error."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.frontends.onnx import from_onnx
from edgerun.ir.dtypes import DType
from edgerun.runtime import load
from tests.onnx.onnx_graphs import device_free_backends

S, I64, F = TensorProto.STRING, TensorProto.INT64, TensorProto.FLOAT
WORDS = np.array([["Monday", "tuesday", "Ünïcödé café"], ["", "a b  c", "x.y.z"]], dtype=object)


def _model(nodes, inputs, outputs, inits=(), opset: int = 20, ml: bool = False):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, c, s) for n, c, s in inputs],
                              [helper.make_tensor_value_info(n, c, s) for n, c, s in outputs], initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("ai.onnx.ml", 4)] if ml else [])
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _check(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """edgerun's outputs (imported once, run on the reference) equal ReferenceEvaluator's exactly."""
    want = ReferenceEvaluator(model).run(None, feeds)
    got = load(from_onnx(model), backends=["reference"]).run([feeds[i.name] for i in model.graph.input])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        if w.dtype.kind in "UO":  # the reference returns some string results as numpy unicode arrays
            assert g.dtype == object and all(type(e) is str for e in g.reshape(-1))
            w = w.astype(object)
        assert g.shape == w.shape and g.dtype == w.dtype, (g, w)
        np.testing.assert_array_equal(g, w)
    return got


def test_string_concat_broadcasts_and_keeps_utf8() -> None:
    model = _model([helper.make_node("StringConcat", ["x", "y"], ["z"])],
                   [("x", S, [2, 3]), ("y", S, [3])], [("z", S, [2, 3])])
    (z,) = _check(model, {"x": WORDS, "y": np.array(["!", "", "→"], dtype=object)})
    assert z[0, 2] == "Ünïcödé café→"


def test_equal_on_strings_broadcasts() -> None:
    model = _model([helper.make_node("Equal", ["x", "y"], ["z"])], [("x", S, [2, 3]), ("y", S, [1, 3])],
                   [("z", TensorProto.BOOL, [2, 3])])
    (z,) = _check(model, {"x": WORDS, "y": np.array([["", "tuesday", "x.y.z"]], dtype=object)})
    assert z.tolist() == [[False, True, False], [True, False, True]]


@pytest.mark.parametrize("pattern", [r"[A-Z][a-z]+", r"\w+(\.\w+)*", r"(?s).*é.*", r"(a|\.?b)?", r"x\.y\.z$",
                                     r"(\W|^)\d{0,3}[^.]*(\W|$)"])
def test_regex_full_match_agrees_with_the_reference(pattern: str) -> None:
    model = _model([helper.make_node("RegexFullMatch", ["x"], ["y"], pattern=pattern)], [("x", S, [2, 3])],
                   [("y", TensorProto.BOOL, [2, 3])])
    _check(model, {"x": WORDS})


@pytest.mark.parametrize("pattern, why", [(r"(a)\1", "backreference"), (r"a(?=b)", "lookaround"),
                                          (r"a\sb", r"\\s"), (r"a$\n", r"\$ before"), (r"(?i)abc", "flags"),
                                          (r"[[:alpha:]]+", "POSIX"), (r"a\Z", r"\\Z"), (r"\pL", "RE2-only"),
                                          (r"a{,3}", "as text"), (r"\N{DIGIT ONE}", "names a character")])
def test_regex_patterns_python_reads_differently_from_re2_are_refused_by_name(pattern: str, why: str) -> None:
    model = _model([helper.make_node("RegexFullMatch", ["x"], ["y"], pattern=pattern)], [("x", S, [2])],
                   [("y", TensorProto.BOOL, [2])])
    with pytest.raises(UnsupportedOpError, match=why):
        from_onnx(model)


@pytest.mark.parametrize("shape", [[3], [1, 3], [2, 3]])
@pytest.mark.parametrize("action, sensitive", [("NONE", 0), ("LOWER", 0), ("UPPER", 1), ("LOWER", 1)])
def test_string_normalizer_matches_the_reference(shape: list[int], action: str, sensitive: int) -> None:
    """Accents stripped, stopwords removed (before or after the case change), and for [C] and [1, C] the
    empty strings dropped: the output's extent is known only once the node has run."""
    x = WORDS[:, :] if shape == [2, 3] else WORDS[0].reshape(shape)
    x = x.copy()
    x.reshape(-1)[0] = "monday"  # a stopword in some spelling
    node = helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action=action, is_case_sensitive=sensitive,
                            stopwords=["Monday", "b", "tuesday"], locale="en_US")
    model = _model([node], [("x", S, shape)], [("y", S, [*shape[:-1], "kept"])])
    _check(model, {"x": x})


def test_string_normalizer_that_drops_everything_gives_one_empty_string() -> None:
    node = helper.make_node("StringNormalizer", ["x"], ["y"], stopwords=["a"], is_case_sensitive=1)
    model = _model([node], [("x", S, [3])], [("y", S, ["kept"])])
    (y,) = _check(model, {"x": np.array(["a", "", "a"], dtype=object)})
    assert y.tolist() == [""]


@pytest.mark.parametrize("attrs", [{}, {"delimiter": "."}, {"delimiter": " ", "maxsplit": 1}, {"maxsplit": 0},
                                   {"delimiter": ""}, {"delimiter": "é"}])
def test_string_split_matches_the_reference(attrs: dict) -> None:
    model = _model([helper.make_node("StringSplit", ["x"], ["y", "n"], **attrs)], [("x", S, [2, 3])],
                   [("y", S, [2, 3, "pieces"]), ("n", I64, [2, 3])])
    y, n = _check(model, {"x": WORDS})
    assert y.shape[:2] == (2, 3) and y.shape[2] == n.max()


def test_string_split_runs_again_at_another_extent() -> None:
    """One imported program serves inputs that split into different numbers of pieces."""
    model = _model([helper.make_node("StringSplit", ["x"], ["y", "n"], delimiter="-")], [("x", S, [2])],
                   [("y", S, [2, "pieces"]), ("n", I64, [2])])
    loaded = load(from_onnx(model), backends=["reference"])
    for x in (["a-b", "c"], ["a-b-c-d", ""], ["", ""]):
        feeds = {"x": np.array(x, dtype=object)}
        y, n = loaded.run([feeds["x"]])
        want_y, want_n = ReferenceEvaluator(model).run(None, feeds)
        np.testing.assert_array_equal(y, want_y.astype(object))
        np.testing.assert_array_equal(n, want_n)


@pytest.mark.parametrize("keys, values, default", [
    ({"keys_strings": ["Monday", "", "x.y.z"]}, {"values_strings": ["M", "empty", "X"]}, {"default_string": "?"}),
    ({"keys_strings": ["Monday", "tuesday"]}, {"values_floats": [1.5, -2.0]}, {}),
    ({"keys_strings": ["a b  c"]}, {"values_int64s": [7]}, {"default_int64": 3}),
])
def test_label_encoder_on_strings_matches_the_reference(keys: dict, values: dict, default: dict) -> None:
    out = F if "values_floats" in values else I64 if "values_int64s" in values else S
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", **keys, **values, **default)
    model = _model([node], [("x", S, [2, 3])], [("y", out, [2, 3])], ml=True)
    _check(model, {"x": WORDS})


def test_label_encoder_from_integers_to_strings() -> None:
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain="ai.onnx.ml", keys_int64s=[1, 2, 5],
                            values_strings=["one", "two", "five"], default_string="other")
    model = _model([node], [("x", I64, [4])], [("y", S, [4])], ml=True)
    (y,) = _check(model, {"x": np.array([5, 1, 3, 2], np.int64)})
    assert y.tolist() == ["five", "one", "other", "two"]


@pytest.mark.parametrize("mode, weights", [("TF", None), ("TFIDF", [0.5, 2.0, 1.0, 3.0, 0.25]),
                                           ("IDF", [0.5, 2.0, 1.0, 3.0, 0.25])])  # the reference needs weights
@pytest.mark.parametrize("skip", [0, 2])
def test_tfidf_vectorizer_on_strings_matches_the_reference(mode: str, weights, skip: int) -> None:
    """Unigrams and bigrams of a string pool, with skips, over [N, C] rows."""
    attrs = dict(mode=mode, min_gram_length=1, max_gram_length=2, max_skip_count=skip, ngram_counts=[0, 3],
                 ngram_indexes=[0, 1, 2, 3, 4], pool_strings=["a", "b", "c", "a", "b", "b", "c"])
    if weights:
        attrs["weights"] = weights
    model = _model([helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)], [("x", S, [2, 6])], [("y", F, [2, 5])])
    x = np.array([["a", "b", "c", "a", "x", "b"], ["b", "c", "b", "a", "b", "a"]], dtype=object)
    _check(model, {"x": x})


def test_tfidf_vectorizer_on_integers_matches_the_reference() -> None:
    attrs = dict(mode="TF", min_gram_length=2, max_gram_length=2, max_skip_count=3, ngram_counts=[0, 4],
                 ngram_indexes=[0, 1, 2, 3, 4, 5, 6], pool_int64s=[2, 3, 5, 4, 5, 6, 7, 8, 6, 7])
    model = _model([helper.make_node("TfIdfVectorizer", ["x"], ["y"], **attrs)], [("x", TensorProto.INT32, [12])],
                   [("y", F, [7])])
    _check(model, {"x": np.array([1, 1, 3, 3, 3, 7, 8, 6, 7, 5, 6, 8], np.int32)})


def test_string_constants_and_backends_that_decline_strings() -> None:
    """A string initializer becomes a graph constant; ONNX Runtime, MNN and the NPU decline every node that
    reads or writes a string (a reshape of strings included), the float ops beside them still go to them,
    and the answer is the reference's."""
    suffix = helper.make_tensor("suffix", S, [3], [b"!", b"", "\u00e9".encode()])
    nodes = [helper.make_node("StringConcat", ["x", "suffix"], ["c"]),
             helper.make_node("Reshape", ["c", "shape"], ["r"]),
             helper.make_node("Equal", ["r", "x"], ["same"]), helper.make_node("Relu", ["f"], ["g"])]
    shape = helper.make_tensor("shape", I64, [2], [2, 3])
    model = _model(nodes, [("x", S, [2, 3]), ("f", F, [2, 3])],
                   [("r", S, [2, 3]), ("same", TensorProto.BOOL, [2, 3]), ("g", F, [2, 3])],
                   inits=[suffix, shape])
    program = from_onnx(model)
    assert any(program.graph.specs[c].dtype is DType.string for c in program.graph.constants)
    f = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    want = ReferenceEvaluator(model).run(None, {"x": WORDS, "f": f})
    from edgerun.backends.registry import available_backends
    others = [b for b in ("onnxruntime", "mnn", "npu") if b in available_backends()]
    assert others, "no backend besides the reference to offer"
    for backend in others:
        loaded = load(program, backends=[backend])
        graph = loaded.parts.graph
        for p in loaded.parts.partitions:
            for n in p.subgraph(graph).nodes:
                touches = any(graph.specs[v].dtype is DType.string for v in (*n.inputs, *n.outputs) if v)
                assert p.backend == "reference" or not touches, (backend, n.op)
        got = loaded.run([WORDS, f])
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, np.asarray(w).astype(g.dtype))


@pytest.mark.parametrize("bad, why", [(np.zeros((2, 3), np.float32), "must be a string tensor"),
                                      (np.array([["a", 1, "b"], ["c", "d", None]], dtype=object), "only str"),
                                      (np.array([[b"a", b"b", b"c"]] * 2, dtype=object), "only str")])
def test_a_non_string_fed_to_a_string_input_is_a_clear_error(bad: np.ndarray, why: str) -> None:
    model = _model([helper.make_node("StringConcat", ["x", "x"], ["y"])], [("x", S, [2, 3])], [("y", S, [2, 3])])
    loaded = load(from_onnx(model), backends=["reference"])
    with pytest.raises(EdgerunError, match=f"input 'x' .*{why}"):
        loaded.run([bad])
    with pytest.raises(EdgerunError, match=f"input 'x' .*{why}"):
        loaded.run({"x": bad})


def test_a_numpy_unicode_array_is_taken_as_strings() -> None:
    model = _model([helper.make_node("StringConcat", ["x", "x"], ["y"])], [("x", S, [2])], [("y", S, [2])])
    (y,) = load(from_onnx(model), backends=["reference"]).run([np.array(["ab", "c"])])
    assert y.dtype == object and y.tolist() == ["abab", "cc"]


def test_a_string_op_on_numbers_is_refused_by_name() -> None:
    model = _model([helper.make_node("StringConcat", ["x", "x"], ["y"])], [("x", F, [2])], [("y", S, [2])])
    with pytest.raises(UnsupportedOpError, match=r"StringConcat.*not a string tensor"):
        from_onnx(model)


def _i64(name: str, values: list[int]):
    return helper.make_tensor(name, I64, [len(values)], values)


MOVES = [  # (node, output shape, initializers): data movement takes strings like any dtype
    (helper.make_node("Reshape", ["x", "s"], ["y"]), [6], [_i64("s", [6])]),
    (helper.make_node("Flatten", ["x"], ["y"], axis=0), [1, 6], []),
    (helper.make_node("Unsqueeze", ["x", "a"], ["y"]), [2, 1, 3], [_i64("a", [1])]),
    (helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0]), [3, 2], []),
    (helper.make_node("Gather", ["x", "i"], ["y"], axis=1), [2, 2], [_i64("i", [2, 0])]),
    (helper.make_node("Slice", ["x", "b", "e"], ["y"]), [2, 2], [_i64("b", [0, 1]), _i64("e", [2, 3])]),
    (helper.make_node("Expand", ["x", "s"], ["y"]), [2, 2, 3], [_i64("s", [2, 2, 3])]),
    (helper.make_node("Tile", ["x", "r"], ["y"]), [2, 6], [_i64("r", [1, 2])]),
    (helper.make_node("Pad", ["x", "p"], ["y"]), [2, 5], [_i64("p", [0, 1, 0, 1])]),
    (helper.make_node("ReverseSequence", ["x", "n"], ["y"], batch_axis=0, time_axis=1), [2, 3], [_i64("n", [2, 3])]),
]


@pytest.mark.parametrize("backend", ["reference", "onnxruntime", "mnn"])
@pytest.mark.parametrize("node, shape, inits", MOVES, ids=[m[0].op_type for m in MOVES])
def test_data_movement_of_strings_matches_the_reference_on_every_backend(node, shape, inits, backend: str) -> None:
    """A reshape of strings is not a view of arena bytes: it copies (an elided no-op raster gave '' once)."""
    from edgerun.backends.registry import available_backends
    if backend not in available_backends():
        pytest.skip(f"{backend} is not installed")
    model = _model([node], [("x", S, [2, 3])], [("y", S, shape)], inits=inits)
    (want,) = ReferenceEvaluator(model).run(None, {"x": WORDS})
    (got,) = load(from_onnx(model), backends=[backend]).run([WORDS])
    assert got.dtype == object and got.shape == want.shape
    np.testing.assert_array_equal(got, np.asarray(want).astype(object))


@pytest.mark.parametrize("src, dst, x", [
    (S, F, np.array(["1.5", "-2", "inf", "1e-3"], dtype=object)),
    (S, I64, np.array(["1", "-2", "30", "7"], dtype=object)),
    (S, TensorProto.BOOL, np.array(["True", "False", "1", ""], dtype=object)),
    (F, S, np.array([1.5, -2, 0.1, np.nan], np.float32)),
    (TensorProto.DOUBLE, S, np.array([1.5, -2, 0.1, 1e300])),
    (I64, S, np.array([1, 2, 3, -4], np.int64)),
    (TensorProto.BOOL, S, np.array([True, False, True, False])),
])
def test_cast_to_and_from_strings_matches_the_reference(src: int, dst: int, x: np.ndarray) -> None:
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=dst)], [("x", src, [4])], [("y", dst, [4])])
    _check(model, {"x": x})


def test_a_constant_cast_to_strings_folds_to_a_string_constant() -> None:
    nodes = [helper.make_node("Cast", ["c"], ["s"], to=S), helper.make_node("StringConcat", ["x", "s"], ["y"])]
    model = _model(nodes, [("x", S, [3])], [("y", S, [3])], inits=[_i64("c", [1, 22, -3])])
    (y,) = _check(model, {"x": np.array(["a", "b", "c"], dtype=object)})
    assert y.tolist() == ["a1", "b22", "c-3"]


def test_a_string_that_is_not_a_number_is_a_clear_error() -> None:
    model = _model([helper.make_node("Cast", ["x"], ["y"], to=F)], [("x", S, [2])], [("y", F, [2])])
    with pytest.raises(EdgerunError, match="cast of a string tensor to float32: could not convert string"):
        load(from_onnx(model), backends=["reference"]).run([np.array(["1", "one"], dtype=object)])


def test_no_backend_but_the_reference_supports_a_node_that_touches_a_string() -> None:
    from edgerun.backends.reference import ReferenceBackend
    nodes = [helper.make_node("Reshape", ["x", "s"], ["r"]), helper.make_node("StringConcat", ["r", "r"], ["c"]),
             helper.make_node("Equal", ["c", "r"], ["e"]), helper.make_node("Not", ["e"], ["y"])]
    model = _model(nodes, [("x", S, [2, 3])], [("y", TensorProto.BOOL, [6])], inits=[helper.make_tensor("s", I64, [1], [6])])
    graph = from_onnx(model, optimize=False).graph
    touching = [n for n in graph.nodes if any(graph.specs[v].dtype is DType.string for v in (*n.inputs, *n.outputs) if v)]
    assert {n.op for n in touching} >= {"string_concat", "string_equal"} and len(touching) >= 3
    backends = device_free_backends()
    assert {b.name for b in backends} >= {"npu", "onnxruntime"}
    for backend in backends:
        assert not any(backend.supports(n, graph) for n in touching), backend.name
    assert all(ReferenceBackend().supports(n, graph) for n in touching)
    assert any(b.supports(n, graph) for b in backends for n in graph.nodes if n not in touching)  # Not on bool
