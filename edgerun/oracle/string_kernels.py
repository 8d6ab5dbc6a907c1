"""Reference kernels of the string ops (ir/ops/string_ops.py), element by element in Python.

They follow ONNX's reference implementation (onnx/reference/ops/) where the spec leaves room: StringNormalizer
strips accents (NFKD, combining marks dropped) before anything else and drops empty strings from a [C] or
[1, C] result, StringSplit splits as Python's str.split does. Only the reference runs these; no backend
declares a kernel for a string tensor.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any

import numpy as np

Kernel = Callable[[list[np.ndarray], dict[str, Any], list[np.ndarray]], None]
DataDependentKernel = Callable[[list[np.ndarray], dict[str, Any]], list[np.ndarray]]


def _string_equal(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    a, b = np.broadcast_arrays(ins[0], ins[1])
    outs[0][...] = np.frompyfunc(lambda x, y: x == y, 2, 1)(a, b).astype(bool) if a.size else False


def _string_concat(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    a, b = np.broadcast_arrays(ins[0], ins[1])
    if a.size:
        outs[0][...] = np.frompyfunc(lambda x, y: x + y, 2, 1)(a, b)


def _regex_full_match(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    # re.ASCII: RE2's \d, \w, \s and \b are ASCII classes (the import refuses what re reads otherwise).
    regex = re.compile(attrs["pattern"], re.ASCII)
    x = ins[0]
    outs[0][...] = np.array([regex.fullmatch(s) is not None for s in x.reshape(-1)], bool).reshape(x.shape)


def _label_encode(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    table = dict(zip(attrs["keys"], attrs["values"]))
    default = attrs.get("default")
    x = ins[0]
    # Keys are Python values (the attrs are JSON): a numeric element is looked up as int or float.
    values = [table.get(v, default) for v in x.reshape(-1).tolist()]
    outs[0][...] = np.array(values, dtype=outs[0].dtype).reshape(x.shape)


# ---- TfIdfVectorizer: a trie of the pool's n-grams, walked from every start with every skip ----------------

class _Trie:
    __slots__ = ("id", "leaves")

    def __init__(self) -> None:
        self.id = 0  # the n-gram's number (from 1) when the path to here is one of the pool's, else 0
        self.leaves: dict[Any, _Trie] = {}


def _pool_trie(attrs: dict[str, Any]) -> _Trie:
    """The pool's n-grams, numbered from 1 in pool order; those outside [min, max] length only take numbers."""
    pool = list(attrs["pool"])
    starts = [int(c) for c in attrs["ngram_counts"]]
    lo, hi = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    root, number = _Trie(), 1
    for size, start in enumerate(starts, start=1):
        end = starts[size] if size < len(starts) else len(pool)
        count = max(end - start, 0) // size
        if not lo <= size <= hi:
            number += count
            continue
        for k in range(count):
            node = root
            for item in pool[start + k * size:start + (k + 1) * size]:
                node = node.leaves.setdefault(item, _Trie())
            node.id = number
            number += 1
    return root


def _tfidf_counts(row: list[Any], root: _Trie, attrs: dict[str, Any]) -> dict[int, int]:
    """How often each pool n-gram (by number) occurs in `row`, skips of up to max_skip_count items included;
    unigrams are counted once (skip distance 1 only), as ONNX's reference counts them."""
    lo, hi = int(attrs["min_gram_length"]), int(attrs["max_gram_length"])
    counts: dict[int, int] = {}
    first_size = lo
    for skip in range(1, int(attrs["max_skip_count"]) + 2):
        for start in range(len(row)):
            if start + skip * (first_size - 1) >= len(row):
                break
            node, size, item = root, 1, start
            while node.leaves and size <= hi and item < len(row):
                child = node.leaves.get(row[item])
                if child is None:
                    break
                if size >= first_size and child.id:
                    counts[child.id] = counts.get(child.id, 0) + 1
                node, size, item = child, size + 1, item + skip
        if first_size == 1:
            first_size = 2
            if first_size > hi:
                break
    return counts


def _tfidf_vectorizer(ins: list[np.ndarray], attrs: dict[str, Any], outs: list[np.ndarray]) -> None:
    x = ins[0]
    rows = x.reshape(1, -1) if x.ndim == 1 else x
    indexes = [int(i) for i in attrs["ngram_indexes"]]
    weights = [float(w) for w in attrs.get("weights") or []]
    mode = attrs["mode"]
    root = _pool_trie(attrs)
    freq = np.zeros((rows.shape[0], int(attrs["output_width"])), np.int64)
    for r in range(rows.shape[0]):
        for number, count in _tfidf_counts(rows[r].tolist(), root, attrs).items():
            freq[r, indexes[number - 1]] += count
    w = np.asarray(weights, np.float32) if weights else np.ones(freq.shape[1], np.float32)
    if mode == "TF":
        y = freq.astype(np.float32)
    elif mode == "IDF":
        y = np.where(freq > 0, w, np.float32(0)).astype(np.float32)
    else:  # TFIDF
        y = (w * freq.astype(np.float32)).astype(np.float32)
    outs[0][...] = y.reshape(outs[0].shape)


# ---- data-dependent ---------------------------------------------------------------------------------------

def _strip_accents(s: str) -> str:
    if s.isascii():
        return s
    return "".join(c for c in unicodedata.normalize("NFKD", s) if not unicodedata.combining(c))


def _without_stopwords(text: str, stops: set[str]) -> str:
    return " ".join(w for w in text.split(" ") if w not in stops)


def _normalize_one(s: str, attrs: dict[str, Any], raw_stops: set[str], stops: set[str]) -> str:
    """One element as ONNX's reference StringNormalizer does it: accents stripped; with is_case_sensitive,
    stopwords (as given) removed before the case change, else the case-changed stopwords after it."""
    action, sensitive = attrs.get("case_change_action", "NONE"), bool(attrs.get("is_case_sensitive", False))
    s = _strip_accents(s)
    if sensitive and stops:
        s = _without_stopwords(s, raw_stops)
    s = s.lower() if action == "LOWER" else s.upper() if action == "UPPER" else s
    if not sensitive and stops:
        s = _without_stopwords(s, stops)
    return s


def _string_normalize(args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = args[0]
    raw_stops = set(attrs.get("stopwords") or [])
    action = attrs.get("case_change_action", "NONE")
    stops = {w.lower() for w in raw_stops} if action == "LOWER" else \
        {w.upper() for w in raw_stops} if action == "UPPER" else raw_stops
    flat = [_normalize_one(s, attrs, raw_stops, stops) for s in x.reshape(-1).tolist()]
    if x.ndim == 1 or x.shape[0] == 1:  # [C] and [1, C] keep their non-empty strings, at least one ('')
        kept = [s for s in flat if s] or [""]
        return [np.array(kept, dtype=object).reshape((len(kept),) if x.ndim == 1 else (1, len(kept)))]
    return [np.array(flat, dtype=object).reshape(x.shape)]


def _string_split(args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    x = args[0]
    delimiter = attrs.get("delimiter") or None  # '' splits at runs of whitespace, as no delimiter does
    maxsplit = attrs.get("maxsplit")
    pieces = [s.split(delimiter, -1 if maxsplit is None else int(maxsplit)) for s in x.reshape(-1).tolist()]
    width = max((len(p) for p in pieces), default=0)
    y = np.full((len(pieces), width), "", dtype=object)
    for i, p in enumerate(pieces):
        y[i, :len(p)] = p
    counts = np.array([len(p) for p in pieces], np.int64).reshape(x.shape)
    return [y.reshape((*x.shape, width)), counts]


STRING_KERNELS: dict[str, Kernel] = {
    "string_equal": _string_equal,
    "string_concat": _string_concat,
    "regex_full_match": _regex_full_match,
    "label_encode": _label_encode,
    "tfidf_vectorizer": _tfidf_vectorizer,
}
STRING_DATA_DEPENDENT_KERNELS: dict[str, DataDependentKernel] = {
    "string_normalize": _string_normalize,
    "string_split": _string_split,
}
