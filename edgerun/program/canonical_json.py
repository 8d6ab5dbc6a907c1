"""Canonical JSON for the graph section: one byte string per document, and a parser that can only fail.

Canonical means sorted keys, no whitespace, UTF-8, so equal documents give equal bytes and a stable hash.
The parser builds plain dicts, lists, strings and numbers (no object hooks that construct classes), rejects
duplicate keys (which would otherwise silently shadow each other), and bounds size and nesting first.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from edgerun.errors import ProgramFormatError
from edgerun.ir.symbolic import SymDim
from edgerun.program.format import (
    MAX_DOCUMENT_DEPTH,
    MAX_JSON_CONTAINERS,
    MAX_JSON_DEPTH,
    MAX_NAME_LENGTH,
    MAX_STRING_LENGTH,
)


def canonical_json_bytes(doc: Any) -> bytes:
    """Sorted keys, compact separators, UTF-8. NaN and ±Infinity are written as Python's json does."""
    try:
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=True).encode("utf-8")
    except (TypeError, ValueError, UnicodeEncodeError) as e:
        raise ProgramFormatError(f"graph cannot be encoded as JSON: {e}") from None


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ProgramFormatError(f"graph section: duplicate JSON key {key[:80]!r}")
            seen.add(key)
    return obj


def json_nesting_depth(raw: bytes) -> int:
    """Deepest bracket nesting outside strings, found without parsing (vectorised, in 1 MiB chunks).

    Checked before json.loads so that how deep the C parser recurses never depends on the interpreter's
    recursion limit, which an embedding application may have raised far beyond what the C stack can take.
    For invalid JSON the count can be wrong only after the point where the parser itself stops.
    """
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"")  # escapes can hide neither quotes nor brackets
    depth, deepest, in_string = 0, 0, False
    chunk = 1 << 20
    for start in range(0, len(text), chunk):
        a = np.frombuffer(text, np.uint8, min(chunk, len(text) - start), start)
        quotes = np.cumsum(a == ord('"'), dtype=np.int64)
        inside = ((quotes + in_string) & 1).astype(bool)
        step = (a == ord("[")).astype(np.int64) + (a == ord("{")) - (a == ord("]")) - (a == ord("}"))
        step[inside] = 0
        levels = depth + np.cumsum(step)
        if len(levels):
            deepest = max(deepest, int(levels.max()))
            depth = int(levels[-1])
            in_string = bool((int(quotes[-1]) + in_string) & 1)
    return deepest


def parse_json_section(raw: bytes) -> Any:
    """Parse the graph section; every failure is a ProgramFormatError."""
    containers = raw.count(b"{") + raw.count(b"[")  # an upper bound: brackets inside strings count too
    if containers > MAX_JSON_CONTAINERS:
        raise ProgramFormatError(f"graph section has {containers} JSON containers, limit {MAX_JSON_CONTAINERS}")
    # The document itself is a few levels deep (graph, nodes, node, attrs) above the attribute values.
    if json_nesting_depth(raw) > MAX_DOCUMENT_DEPTH:
        raise ProgramFormatError(f"graph section: JSON nested too deeply (limit {MAX_DOCUMENT_DEPTH})")
    try:
        text = raw.decode("utf-8")
        return json.loads(text, object_pairs_hook=_reject_duplicate_keys)
    except ProgramFormatError:
        raise
    except UnicodeDecodeError as e:
        raise ProgramFormatError(f"graph section is not UTF-8: {e.reason} at byte {e.start}") from None
    except RecursionError:
        raise ProgramFormatError("graph section: JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, and ints longer than Python's digit limit
        raise ProgramFormatError(f"graph section is not valid JSON: {e}") from None


def check_string(s: object, what: str, max_length: int = MAX_NAME_LENGTH) -> str:
    if type(s) is not str:
        raise ProgramFormatError(f"{what} must be a string, got {type(s).__name__}")
    if len(s) > max_length:
        raise ProgramFormatError(f"{what} is {len(s)} characters long, limit {max_length}")
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError:  # lone surrogates from "\udXXX" escapes cannot be written back
            raise ProgramFormatError(f"{what} is not valid Unicode (lone surrogate)") from None
    return s


def check_json_value(value: Any, what: str, depth: int = 0) -> None:
    """A JSON value of bounded depth with string keys and encodable strings (what attrs and metadata hold)."""
    if depth > MAX_JSON_DEPTH:
        raise ProgramFormatError(f"{what} is nested deeper than {MAX_JSON_DEPTH}")
    t = type(value)
    if value is None or t is bool or t is int:
        return
    if t is float:
        return  # NaN and infinities are allowed: attributes such as clamp bounds legitimately use them
    if t is str:
        check_string(value, what, MAX_STRING_LENGTH)
    elif t is list:
        for i, item in enumerate(value):
            check_json_value(item, f"{what}[{i}]", depth + 1)
    elif t is dict:
        for k, item in value.items():
            check_string(k, f"key in {what}")
            check_json_value(item, f"{what}[{k!r}]", depth + 1)
    else:
        raise ProgramFormatError(f"{what} has type {t.__name__}, which is not a JSON value")


def to_json_value(value: Any, what: str, depth: int = 0) -> Any:
    """Writer side: the JSON form of an attribute or metadata value; tuples become lists, nothing else converts.

    numpy scalars and other look-alikes are refused rather than coerced, so a frontend that leaks them finds
    out at save time instead of getting a program whose attributes changed type on the way through.
    """
    if depth > MAX_JSON_DEPTH:
        raise ProgramFormatError(f"{what} is nested deeper than {MAX_JSON_DEPTH}")
    t = type(value)
    if value is None or t in (bool, int, str):
        return value
    if t is float:
        return value
    if t is SymDim:  # a symbolic dimension in a template's attributes (reshape's shape, ...)
        return value.to_json()
    if t in (list, tuple):
        return [to_json_value(v, f"{what}[{i}]", depth + 1) for i, v in enumerate(value)]
    if t is dict:
        out = {}
        for k, v in value.items():
            if type(k) is not str:
                raise ProgramFormatError(f"{what} has a non-string key {k!r}")
            out[k] = to_json_value(v, f"{what}[{k!r}]", depth + 1)
        return out
    raise ProgramFormatError(f"{what} has type {t.__name__}, which is not a JSON value "
                             "(only None, bool, int, float, str, list, tuple, dict)")
