"""The text and JSON forms of a symbolic dimension: `str(d)` read back by a recursive-descent parser.

The grammar is small on purpose (integers, symbols, + - * // %, max(a, b), min(a, b), parentheses) and the
parser is bounded in length and nesting, because the text comes from program files, which may be hostile.
It never calls eval, and every value it builds goes through symbolic.py's arithmetic, so what it returns is
canonical: `parse_dim(str(d)) == d`.
"""

from __future__ import annotations

import re

from edgerun.ir.symbolic import (
    NAME,
    RESERVED,
    Dim,
    SymbolicShapeError,
    floordiv,
    mod,
    sym,
    sym_max,
    sym_min,
)

MAX_EXPRESSION_LENGTH = 4096  # characters of a dimension's text form; bounds the parser's work


_TOKEN = re.compile(r"\s*(?:(\d+)|([A-Za-z_][A-Za-z0-9_]*)|(//|[-+*%(),]))")


def parse_dim(text: str) -> Dim:
    """Read back `str(d)` (or any expression over ints, symbols, + - * // %, max(,), min(,) and parentheses)."""
    if not isinstance(text, str):
        raise SymbolicShapeError(f"a symbolic dimension's text must be a string, got {type(text).__name__}")
    if len(text) > MAX_EXPRESSION_LENGTH:
        raise SymbolicShapeError(f"symbolic dimension text is {len(text)} characters, limit {MAX_EXPRESSION_LENGTH}")
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if not m:
            raise SymbolicShapeError(f"cannot parse dimension {text!r} at character {pos}")
        tokens.append(m.group(m.lastindex or 0))
        pos = m.end()
    parser = _Parser(tokens, text)
    value = parser.expression(0)
    if parser.pos != len(tokens):
        raise SymbolicShapeError(f"cannot parse dimension {text!r}: unexpected {tokens[parser.pos]!r}")
    return value


class _Parser:
    MAX_DEPTH = 64

    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens, self.text, self.pos = tokens, text, 0

    def _peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def _take(self, want: str | None = None) -> str:
        tok = self._peek()
        if tok is None or (want is not None and tok != want):
            raise SymbolicShapeError(f"cannot parse dimension {self.text!r}: expected {want or 'more'} "
                                     f"at token {self.pos}")
        self.pos += 1
        return tok

    def expression(self, depth: int) -> Dim:
        if depth > self.MAX_DEPTH:
            raise SymbolicShapeError(f"dimension {self.text[:80]!r} is nested too deeply")
        value = self.term(depth)
        while self._peek() in ("+", "-"):
            op = self._take()
            rhs = self.term(depth)
            value = value + rhs if op == "+" else value - rhs
        return value

    def term(self, depth: int) -> Dim:
        value = self.factor(depth)
        while self._peek() in ("*", "//", "%"):
            op = self._take()
            rhs = self.factor(depth)
            value = value * rhs if op == "*" else floordiv(value, rhs) if op == "//" else mod(value, rhs)
        return value

    def factor(self, depth: int) -> Dim:
        tok = self._take()
        if tok == "-":
            return -self.factor(depth + 1)
        if tok == "(":
            value = self.expression(depth + 1)
            self._take(")")
            return value
        if tok.isdigit():
            return int(tok)
        if tok in RESERVED:
            self._take("(")
            a = self.expression(depth + 1)
            self._take(",")
            b = self.expression(depth + 1)
            self._take(")")
            return sym_max(a, b) if tok == "max" else sym_min(a, b)
        if NAME.match(tok):
            return sym(tok)
        raise SymbolicShapeError(f"cannot parse dimension {self.text!r}: unexpected {tok!r}")


# -- JSON form of a dimension ---------------------------------------------------------------------------------
def dim_from_json(obj: object) -> Dim:
    """An int stays an int; {"sym": text} is parsed. Anything else is a SymbolicShapeError."""
    if type(obj) is int:
        return obj
    if type(obj) is dict and set(obj) == {"sym"} and isinstance(obj["sym"], str):
        return parse_dim(obj["sym"])
    raise SymbolicShapeError(f"a dimension must be an integer or {{\"sym\": text}}, got {str(obj)[:80]}")
