"""String ONNX ops: StringConcat, RegexFullMatch, StringNormalizer, StringSplit, TfIdfVectorizer and
ai.onnx.ml LabelEncoder (Equal on strings is elementwise.py's, emitting string_equal).

A string tensor is DType.string (ir/dtypes.py); each op becomes one IR op of ir/ops/string_ops.py, run by the
reference alone. RegexFullMatch's pattern is RE2 syntax and Python's `re` runs it (as ONNX's reference does):
with re.ASCII, since RE2's \\d, \\w and \\b are ASCII classes, and refused, naming the construct, wherever `re`
would read the pattern otherwise or RE2 has no such construct (`unsupported_regex`).
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.data_dependent import extent_symbol
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.ir.dtypes import DType

# Pieces one string may split into when StringSplit has no maxsplit: the extent symbol's upper bound.
MAX_SPLIT_PIECES = 1 << 16


def decoded(value: Any) -> Any:
    """An ONNX STRING or STRINGS attribute as str (a list of them): attributes hold UTF-8 bytes."""
    if isinstance(value, (list, tuple)):
        return [decoded(v) for v in value]
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _string_input(ctx: ImportContext, node: OnnxNode, i: int) -> str:
    x = ctx.input(node, i)
    if ctx.b.dtype(x) is not DType.string:
        raise node.refuse(f"input {i} is {ctx.b.dtype(x).value}, not a string tensor")
    return x


@onnx_op("StringConcat")
def string_concat(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    return [ctx.emit("string_concat", [_string_input(ctx, node, 0), _string_input(ctx, node, 1)])]


@onnx_op("RegexFullMatch")
def regex_full_match(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    pattern = decoded(node.attr("pattern"))
    if not isinstance(pattern, str):
        raise node.refuse("no pattern attribute")
    why = unsupported_regex(pattern)
    if why:
        raise node.refuse(f"pattern {pattern!r}: {why}")
    return [ctx.emit("regex_full_match", [_string_input(ctx, node, 0)], pattern=pattern)]


# re's opcodes for constructs RE2 does not have (backreferences, lookaround, atomic groups, possessive
# repeats, conditionals).
_NOT_RE2 = {"GROUPREF": "a backreference", "GROUPREF_EXISTS": "a conditional group", "ASSERT": "a lookaround",
            "ASSERT_NOT": "a lookaround", "ATOMIC_GROUP": "an atomic group", "POSSESSIVE_REPEAT": "a possessive repeat"}
_REPEATS = ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
_SPACE = ("CATEGORY_SPACE", "CATEGORY_NOT_SPACE")


def unsupported_regex(pattern: str) -> str:
    """Why Python's re (with re.ASCII, as a full match) would not match as RE2 does; '' when it would.

    Refused: what RE2 lacks (above), \\Z, flags other than (?m) and (?s) ((?i) folds case by Unicode in RE2,
    by ASCII here), POSIX classes such as [[:alpha:]] (re reads them as a set of characters), {,n} and \\N{..}
    (re's own), \\s (RE2's lacks \\v), and $ anywhere but the pattern's end (re's $ also matches before a final
    newline)."""
    import re._parser as sre_parse  # the stdlib's own parser: what `re` will run, opcode by opcode

    if "[:" in pattern:
        return "a POSIX class or '[:' in a set (re reads it as characters)"
    if re.search(r"(?<!\\)\{,", pattern):
        return "{,n} (re repeats 0 to n times, RE2 reads it as text)"
    if "\\N{" in pattern:
        return "\\N{name} (re names a character, RE2 has no such escape)"
    try:
        parsed: Any = sre_parse.parse(pattern)
    except re.error as exc:
        return f"not a regular expression Python's re reads ({exc}; RE2-only escapes such as \\pN, \\Q or \\z)"
    extra = parsed.state.flags & ~(re.UNICODE | re.MULTILINE | re.DOTALL)
    if extra:
        return f"flags {re.RegexFlag(extra)!r} (only (?m) and (?s) read alike in RE2 and re)"
    return _walk(list(parsed), True, bool(parsed.state.flags & re.MULTILINE))


def _walk(items: list[Any], at_tail: bool, multiline: bool) -> str:
    for k, (op, av) in enumerate(items):
        name, tail = str(op), at_tail and k == len(items) - 1
        if name in _NOT_RE2:
            return f"{_NOT_RE2[name]} (RE2 has none)"
        if name == "AT" and str(av) == "AT_END_STRING":
            return "\\Z (RE2 has none; it writes \\z)"
        if name == "AT" and str(av) == "AT_END" and not (tail or multiline):
            return "$ before the pattern's end (re's $ also matches before a final newline, RE2's does not)"
        if name in ("IN", "CATEGORY"):
            inner = av if name == "IN" else [(op, av)]
            if any(str(o) == "CATEGORY" and str(a) in _SPACE for o, a in inner):
                return "\\s or \\S (RE2's \\s is [\\t\\n\\f\\r ], re's also has \\v)"
        if name == "SUBPATTERN":
            if av[1] & ~(re.MULTILINE | re.DOTALL) or av[2]:
                return "an inline flag group other than (?m:...) and (?s:...)"
            why = _walk(list(av[3]), tail, multiline or bool(av[1] & re.MULTILINE))
        elif name == "BRANCH":
            why = next((w for w in (_walk(list(b), tail, multiline) for b in av[1]) if w), "")
        elif name in _REPEATS:
            why = _walk(list(av[2]), False, multiline)
        else:
            why = ""
        if why:
            return why
    return ""


@onnx_op("StringNormalizer")
def string_normalizer(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _string_input(ctx, node, 0)
    shape = ctx.b.shape(x)
    if len(shape) not in (1, 2):
        raise node.refuse(f"input of rank {len(shape)} (ONNX takes [C] or [1, C])")
    action = decoded(node.attr("case_change_action", "NONE"))
    if action not in ("NONE", "LOWER", "UPPER"):
        raise node.refuse(f"case_change_action {action!r}")
    # locale only picks the case mapping in ONNX Runtime; Python's str.lower/upper (the reference's) are
    # locale-independent, so it is accepted and has no effect, as in ONNX's reference.
    count = extent_symbol(ctx, node, "kept", shape[-1])
    return [ctx.emit("string_normalize", [x], extent=count, case_change_action=action,
                     is_case_sensitive=bool(node.attr("is_case_sensitive", 0)),
                     stopwords=decoded(list(node.attr("stopwords", []) or [])))]


@onnx_op("StringSplit")
def string_split(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = _string_input(ctx, node, 0)
    maxsplit = node.attr("maxsplit")
    delimiter = decoded(node.attr("delimiter", "")) or None
    most = MAX_SPLIT_PIECES if maxsplit is None else int(maxsplit) + 1
    count = extent_symbol(ctx, node, "pieces", most)
    return list(ctx.b.emit_multi("string_split", [x], extent=count, delimiter=delimiter,
                                 maxsplit=None if maxsplit is None else int(maxsplit)))


@onnx_op("TfIdfVectorizer")
def tfidf_vectorizer(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    x = ctx.input(node, 0)
    dtype = ctx.b.dtype(x)
    pool: list[Any] = decoded(list(node.attr("pool_strings", []) or [])) if dtype is DType.string else \
        [int(v) for v in node.attr("pool_int64s", []) or []]
    indexes = [int(i) for i in node.attr("ngram_indexes", []) or []]
    mode = decoded(node.attr("mode"))
    if mode not in ("TF", "IDF", "TFIDF"):
        raise node.refuse(f"mode {mode!r}")
    if not indexes:
        raise node.refuse("no ngram_indexes")
    return [ctx.emit("tfidf_vectorizer", [x], pool=pool, ngram_counts=[int(c) for c in node.attr("ngram_counts")],
                     ngram_indexes=indexes, output_width=max(indexes) + 1, mode=mode,
                     min_gram_length=int(node.attr("min_gram_length")),
                     max_gram_length=int(node.attr("max_gram_length")),
                     max_skip_count=int(node.attr("max_skip_count")),
                     weights=[float(np.float32(w)) for w in node.attr("weights", []) or []])]


_KEY_ATTRS = {"keys_strings": DType.string, "keys_int64s": DType.int64, "keys_floats": DType.float32}
_VALUE_ATTRS = {"values_strings": (DType.string, "default_string"), "values_int64s": (DType.int64, "default_int64"),
                "values_floats": (DType.float32, "default_float")}
_DEFAULTS = {"default_string": "_Unused", "default_int64": -1, "default_float": -0.0}


def _tensor_attr(node: OnnxNode, key: str) -> np.ndarray | None:
    value = node.attr(key)
    if value is None:
        return None
    from onnx import numpy_helper
    return numpy_helper.to_array(value)


@onnx_op("ai.onnx.ml:LabelEncoder")
def label_encoder(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    """Each element through the keys -> values table; absent keys give the default (ONNX's defaults: '_Unused',
    -1, -0.0). Keys and values come as lists (keys_strings, values_int64s, ...) or tensors (opset 4)."""
    x = ctx.input(node, 0)
    keys_tensor, values_tensor = _tensor_attr(node, "keys_tensor"), _tensor_attr(node, "values_tensor")
    key_attr = next((k for k in _KEY_ATTRS if node.attr(k)), None)
    if keys_tensor is not None:
        key_dtype, keys = DType.of(keys_tensor), keys_tensor.reshape(-1).tolist()
    elif key_attr is not None:
        key_dtype, keys = _KEY_ATTRS[key_attr], decoded(list(node.attr(key_attr)))
    else:
        raise node.refuse("no keys")
    value_attr = next((k for k in _VALUE_ATTRS if node.attr(k)), None)
    default_tensor = _tensor_attr(node, "default_tensor")
    default: Any
    if values_tensor is not None:
        value_dtype, values = DType.of(values_tensor), values_tensor.reshape(-1).tolist()
        default = default_tensor.reshape(-1)[0].item() if default_tensor is not None else \
            _DEFAULTS["default_string" if value_dtype is DType.string else "default_int64"]
    elif value_attr is not None:
        value_dtype, default_key = _VALUE_ATTRS[value_attr]
        values = decoded(list(node.attr(value_attr)))
        default = decoded(node.attr(default_key, _DEFAULTS[default_key]))
    else:
        raise node.refuse("no values")
    if key_dtype is not ctx.b.dtype(x):
        raise node.refuse(f"keys are {key_dtype.value}, the input is {ctx.b.dtype(x).value}")
    if key_dtype.is_float and any(isinstance(k, float) and math.isnan(k) for k in keys):
        raise node.refuse("a NaN key")
    if value_dtype.is_float:
        values, default = [float(v) for v in values], float(default)
    return [ctx.emit("label_encode", [x], keys=keys, values=values, default=default, key_dtype=key_dtype.value,
                     value_dtype=value_dtype.value)]
