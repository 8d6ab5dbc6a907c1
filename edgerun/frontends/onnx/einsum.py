"""Einsum as transposes, reductions and one batched matmul per operand pair (diagonals, an index repeated
within one operand, gathered first)."""

from __future__ import annotations

import math

import numpy as np

from edgerun.frontends.onnx.context import ImportContext, OnnxNode


def _parse(equation: str, ranks: list[int], node: OnnxNode) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, _, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ValueError(f"einsum {equation!r} names {len(terms)} operands, got {len(ranks)}")
    ell_letters = "".join(chr(c) for c in range(ord("A"), ord("Z") + 1) if chr(c) not in eq)
    ell_len = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks) if "..." in t), default=0)
    expanded = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            n = r - len(t.replace("...", ""))
            t = t.replace("...", ell_letters[ell_len - n:ell_len])
        if len(t) != r:
            raise ValueError(f"einsum term {t!r} does not match an operand of rank {r}")
        expanded.append(t)
    if "->" in eq:
        out = rhs.replace("...", ell_letters[:ell_len])
    else:
        counts = {c: sum(t.count(c) for t in expanded) for c in set("".join(expanded))}
        out = ell_letters[:ell_len] + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell_letters))
    return expanded, out


def _diagonals(ctx: ImportContext, node: OnnxNode, x: str, term: str) -> tuple[str, str]:
    """An operand whose term repeats an index ('ii'): its diagonal along each repeated pair, gathered from the
    two axes flattened into one (positions k * (n + 1))."""
    while len(set(term)) != len(term):
        c = next(c for c in term if term.count(c) > 1)
        p, q = term.index(c), term.index(c, term.index(c) + 1)
        shape = ctx.b.shape(x)
        n = shape[p]
        if not isinstance(n, int) or shape[q] != n:
            raise node.refuse(f"a diagonal over sizes {shape[p]} and {shape[q]} ({term!r})")
        rest = [i for i in range(len(term)) if i not in (p, q)]
        x = ctx.emit("transpose", [x], perm=[*rest, p, q])
        x = ctx.emit("reshape", [x], shape=[*(shape[i] for i in rest), n * n])
        x = ctx.emit("gather", [x, ctx.b.const(np.arange(n, dtype=np.int64) * (n + 1))], axis=len(rest))
        term = "".join(term[i] for i in rest) + c
    return x, term


def _sum_out(ctx: ImportContext, x: str, term: str, keep: set[str]) -> tuple[str, str]:
    drop = [i for i, c in enumerate(term) if c not in keep]
    if not drop:
        return x, term
    return ctx.emit("reduce_sum", [x], axes=drop, keepdims=False), "".join(c for c in term if c in keep)


def _permute(ctx: ImportContext, x: str, term: str, order: str) -> str:
    if term == order:
        return x
    return ctx.emit("transpose", [x], perm=[term.index(c) for c in order])


def _pair(ctx: ImportContext, a: str, ta: str, b: str, tb: str, keep: set[str]) -> tuple[str, str]:
    sizes = {c: d for t, v in ((ta, a), (tb, b)) for c, d in zip(t, ctx.b.shape(v))}
    for t, v in ((ta, a), (tb, b)):
        for c, d in zip(t, ctx.b.shape(v)):
            if d != sizes[c]:
                raise ValueError(f"einsum index {c} has sizes {d} and {sizes[c]}")
    batch = "".join(c for c in ta if c in tb and c in keep)
    contract = "".join(c for c in ta if c in tb and c not in keep)
    a_only = "".join(c for c in ta if c not in tb)
    b_only = "".join(c for c in tb if c not in ta)
    a = _permute(ctx, a, ta, batch + a_only + contract)
    b = _permute(ctx, b, tb, batch + contract + b_only)

    def count(s: str) -> int:
        return math.prod(sizes[c] for c in s)
    a = ctx.emit("reshape", [a], shape=[count(batch), count(a_only), count(contract)])
    b = ctx.emit("reshape", [b], shape=[count(batch), count(contract), count(b_only)])
    y = ctx.emit("matmul", [a, b])
    out_term = batch + a_only + b_only
    return ctx.emit("reshape", [y], shape=[sizes[c] for c in out_term]), out_term


def einsum(ctx: ImportContext, node: OnnxNode, equation: str, xs: list[str]) -> str:
    terms, out = _parse(equation, [len(ctx.b.shape(x)) for x in xs], node)
    # Sum away indices that appear in one operand only and not in the output before any product.
    vals = list(xs)
    for i, (x, t) in enumerate(zip(vals, terms)):
        vals[i], terms[i] = _diagonals(ctx, node, x, t)
    for i, (x, t) in enumerate(zip(vals, terms)):
        elsewhere = set(out).union(*(set(u) for j, u in enumerate(terms) if j != i))
        vals[i], terms[i] = _sum_out(ctx, x, t, elsewhere)
    acc, acc_t = vals[0], terms[0]
    for i in range(1, len(vals)):
        later = set(out).union(*(set(u) for u in terms[i + 1:]))
        acc, acc_t = _pair(ctx, acc, acc_t, vals[i], terms[i], later)
    acc, acc_t = _sum_out(ctx, acc, acc_t, set(out))
    return _permute(ctx, acc, acc_t, out)
