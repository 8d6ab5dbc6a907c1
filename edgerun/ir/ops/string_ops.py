"""Ops on string tensors (DType.string: object arrays of Python str, ir/dtypes.py).

Only the reference runs them (oracle/string_kernels.py): every other backend declares kernels by numeric
dtype, so placement keeps these nodes, and every node reading or writing a string tensor, on the reference.
Data movement (reshape, gather, concat, raster) takes strings like any other dtype.

Two are data-dependent (ops/data_dependent_ops.py): how many pieces string_split gives, and how many
elements string_normalize keeps after dropping empty ones, are known only once the node has run; each names
a fresh symbol in attr `extent`.
"""

from __future__ import annotations

import re
from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.ops._rules import broadcast_shapes
from edgerun.ir.ops.data_dependent_ops import extent
from edgerun.ir.registry import OpDef, OpKind, register, register_no_gradient
from edgerun.ir.tensor_spec import TensorSpec

Attrs = dict[str, Any]
CASE_ACTIONS = ("NONE", "LOWER", "UPPER")


def _strings(ins: list[TensorSpec], op: str) -> None:
    for spec in ins:
        if spec.dtype is not DType.string:
            raise ValueError(f"{op} takes string tensors, got {spec}")


def _string_equal_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    _strings(ins, "string_equal")
    return [TensorSpec(broadcast_shapes(ins[0].shape, ins[1].shape), DType.bool)]


def _string_concat_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    _strings(ins, "string_concat")
    return [TensorSpec(broadcast_shapes(ins[0].shape, ins[1].shape), DType.string)]


def _regex_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    _strings(ins, "regex_full_match")
    pattern = attrs.get("pattern")
    if not isinstance(pattern, str):
        raise ValueError(f"regex_full_match needs a str attr 'pattern', got {pattern!r}")
    try:
        re.compile(pattern, re.ASCII)
    except re.error as exc:
        raise ValueError(f"regex_full_match pattern {pattern!r} does not compile: {exc}") from None
    return [TensorSpec(ins[0].shape, DType.bool)]


def _normalize_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    _strings(ins, "string_normalize")
    if x.rank not in (1, 2):
        raise ValueError(f"string_normalize takes [C] or [N, C], got {x}")
    if attrs.get("case_change_action", "NONE") not in CASE_ACTIONS:
        raise ValueError(f"string_normalize case_change_action must be one of {CASE_ACTIONS}")
    n = extent(attrs)
    return [TensorSpec((n,) if x.rank == 1 else (x.shape[0], n), DType.string)]


def _split_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    _strings(ins, "string_split")
    return [TensorSpec((*x.shape, extent(attrs)), DType.string), TensorSpec(x.shape, DType.int64)]


def _label_encode_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    keys, values = attrs.get("keys"), attrs.get("values")
    if not isinstance(keys, list) or not isinstance(values, list) or len(keys) != len(values):
        raise ValueError("label_encode needs attrs 'keys' and 'values', two lists of one length")
    if DType(str(attrs.get("key_dtype"))) is not ins[0].dtype:
        raise ValueError(f"label_encode keys are {attrs.get('key_dtype')}, its input is {ins[0]}")
    return [TensorSpec(ins[0].shape, DType(str(attrs.get("value_dtype"))))]


def _tfidf_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    if x.dtype not in (DType.string, DType.int32, DType.int64) or x.rank not in (1, 2):
        raise ValueError(f"tfidf_vectorizer takes a [C] or [N, C] tensor of strings, int32 or int64, got {x}")
    width = int(attrs.get("output_width", 0))
    return [TensorSpec((width,) if x.rank == 1 else (x.shape[0], width), DType.float32)]


register(OpDef("string_equal", OpKind.ATOMIC, _string_equal_rule, 2, 2,
               doc="elementwise equality of two string tensors (broadcasting): ONNX Equal on strings"))
register(OpDef("string_concat", OpKind.ATOMIC, _string_concat_rule, 2, 2,
               doc="elementwise concatenation of two string tensors (broadcasting): StringConcat"))
register(OpDef("regex_full_match", OpKind.ATOMIC, _regex_rule, 1, 1,
               doc="whether each string matches attr pattern whole (RE2 syntax; the patterns Python's re reads "
                   "alike, ASCII classes): RegexFullMatch"))
register(OpDef("label_encode", OpKind.ATOMIC, _label_encode_rule, 1, 1,
               doc="map each element through attrs keys -> values (attr default otherwise), key_dtype -> "
                   "value_dtype, strings included: ai.onnx.ml LabelEncoder"))
register(OpDef("tfidf_vectorizer", OpKind.ATOMIC, _tfidf_rule, 1, 1,
               doc="n-gram counts (TF, IDF or TFIDF weighted) over a pool of string or integer n-grams, rows of "
                   "a [N, C] input or a [C] one: ONNX TfIdfVectorizer"))
register(OpDef("string_normalize", OpKind.DATA_DEPENDENT, _normalize_rule, 1, 1,
               doc="accents stripped, stopwords removed, case changed, empty strings dropped from [C] or [1, C] "
                   "(attr extent: the count kept): ONNX StringNormalizer as its reference implementation does"))
register(OpDef("string_split", OpKind.DATA_DEPENDENT, _split_rule, 1, 1,
               doc="each string split at attr delimiter (None: runs of whitespace) at most attr maxsplit times, "
                   "padded with '' to attr extent pieces; outputs the pieces and each string's count"))
register_no_gradient(["string_normalize", "string_split"],
                     "string processing is not differentiable")
