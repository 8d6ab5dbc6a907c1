"""Every assert in the test suite can fail: a reader of the tests' source that flags the shapes of assertion
that hold whatever the code under test does (a non-empty tuple, a constant, `x == x`, a count `>= 0`)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# Names of calls whose result is a count or a size: never negative, so `>= 0` on them checks nothing.
COUNT_WORDS = ("len", "count", "flush", "num_", "size")


def _call_name(node: ast.expr) -> str:
    if isinstance(node, ast.Call):
        f = node.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
    return ""


def tautology(test: ast.expr) -> str | None:
    """Why `assert test` cannot fail, or None."""
    if isinstance(test, ast.Tuple) and test.elts:
        return "a non-empty tuple is always true (a message in parentheses?)"
    if isinstance(test, ast.Constant) and test.value:
        return "a true constant"
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) and any(
            isinstance(v, ast.Constant) and v.value for v in test.values):
        return "`or` with a true constant"
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, ast.Eq | ast.Is | ast.GtE | ast.LtE) and ast.dump(left) == ast.dump(right) \
                and not _call_name(left):
            return "compares a value with itself"
        name = _call_name(left).lower()
        if isinstance(op, ast.GtE) and isinstance(right, ast.Constant) and right.value == 0 \
                and any(w in name for w in COUNT_WORDS):
            return f"{_call_name(left)}() is a count, never negative"
    if isinstance(test, ast.Call) and _call_name(test) == "isinstance" and len(test.args) == 2 \
            and isinstance(test.args[1], ast.Name) and test.args[1].id == "object":
        return "everything is an object"
    return None


def find_tautologies(source: str, filename: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Assert) and (why := tautology(node.test)):
            found.append(f"{filename}:{node.lineno}: {ast.unparse(node.test)}: {why}")
    return found


def test_no_test_asserts_a_tautology() -> None:
    found = [t for path in sorted(TESTS.rglob("*.py"))
             for t in find_tautologies(path.read_text(), str(path.relative_to(TESTS.parent)))]
    assert found == []


def test_the_reader_finds_each_kind_of_tautology() -> None:
    src = ("assert (x == 1, 'msg')\nassert True\nassert y or 1\nassert a.b == a.b\n"
           "assert agent.flush_reports() >= 0\nassert len(xs) >= 0\nassert isinstance(v, object)\n"
           "assert x == 1\nassert f() == f()\nassert len(xs) >= 1\nassert mean(xs) >= 0\n")
    found = find_tautologies(src, "t.py")
    assert [int(f.split(":")[1]) for f in found] == [1, 2, 3, 4, 5, 6, 7]
