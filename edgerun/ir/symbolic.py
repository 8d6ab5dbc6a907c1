"""SymDim: a tensor dimension that is an integer expression over named symbols ("batch", "seq", ...).

A program with symbolic dimensions is a template: the runtime binds each symbol from the input shapes and
specialises the graph per concrete shape. Until then shape rules compute with SymDims the way they compute
with ints (`d * 2 + 1`, `(h - 3) // 2 + 1`), so every output spec is an expression over the input symbols.

The expression is kept in one canonical form, so equal expressions compare equal and hash alike:
a sum of integer-weighted monomials, each monomial a sorted product of atoms, an atom a symbol or an
operation that does not simplify (`floor(a / c)` of a non-divisible sum, `a % c`, `max`, `min`). Arithmetic
that comes out constant returns a plain int, so a SymDim is never a disguised constant. Rules that make
different spellings of one size one form (each sound for every integer value of the symbols):
- a constant divisor is positive, and a dividend's coefficients (its constant too) are reduced into
  [0, divisor): `(h - 3)//2 + 1` and `(h - 1)//2` are both `((h + 1)//2) - 1`, `(3*h - 1) % 2` is `(h + 1) % 2`;
- nested quotients by constants merge, `((x//m) + k)//n` = `(x + k*m)//(m*n)`, and a remainder of a remainder
  (or a quotient of one, by a divisor at least as large) folds away;
- a multiple of its divisor times a quotient is written with the remainder, `n*(x//n)` = `x - x % n`, so
  `x - n*(x//n)` is `x % n` (ONNX exporters spell ceil and mod that way);
- a sum holding one `max`/`min` (times a constant) is the max/min of sums, `x - min(x + 1, 0)` = `max(x, -1)`,
  so terms that cancel inside do;
- an expression whose symbols occur only inside remainders by constants is periodic, so evaluating it over
  one period decides it: `n%2 + 1 - (n%2 + 1)//2` is 1, and `-(n % 3) > 0` is false, for every n.

`str(d)` is a parseable form and `symbolic_text.parse_dim(text)` reads it back with a small
recursive-descent parser (never eval; no sympy). `int(d)` raises a clear error naming the symbol: a shape rule that truly needs a
concrete size says so instead of computing with a wrong one.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import numpy as np

from edgerun.errors import EdgerunError

Dim = Union[int, "SymDim"]

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
RESERVED = frozenset({"max", "min"})  # function names in the text form, so never symbols


class SymbolicShapeError(EdgerunError):
    """A symbolic dimension was used where a concrete size is needed, or an expression is malformed."""


# -- atoms: the indivisible factors of a monomial -------------------------------------------------------------
@dataclass(frozen=True)
class _Atom:
    kind: str  # "sym", "floordiv", "mod", "max", "min"
    name: str = ""
    args: tuple[Dim, ...] = ()

    def key(self) -> str:
        return _atom_text(self)


Monomial = tuple[_Atom, ...]  # sorted by key; () is the constant monomial


def _atom_text(atom: _Atom) -> str:
    if atom.kind == "sym":
        return atom.name
    if atom.kind in ("max", "min"):
        return f"{atom.kind}({', '.join(_text(a) for a in atom.args)})"
    # Wrapped whole, so the atom reads back as one factor inside a product ("2*((h - 3)//2)").
    op = "//" if atom.kind == "floordiv" else "%"
    return f"({_factor_text(atom.args[0])}{op}{_factor_text(atom.args[1])})"


def _factor_text(d: Dim) -> str:
    text = _text(d)
    return text if (isinstance(d, int) and d >= 0) or _single_atom(d) is not None else f"({text})"


def _text(d: Dim) -> str:
    return str(d)


# For the type checker a SymDim is an int: it supports every int operation shape code uses (+ - * // %,
# ==, hashing) and refuses the others at run time with a SymbolicShapeError naming its symbols (int(),
# indexing, truth, undecidable order). This keeps the many static-only layers (runtime, backends) typed as
# they are, while the frontends and shape rules pass SymDims through untouched.
if TYPE_CHECKING:
    _IntForTypeChecking = int
else:
    _IntForTypeChecking = object


class SymDim(_IntForTypeChecking):
    """An immutable, canonical integer expression over named symbols. Build with `sym(name)` or arithmetic."""

    __slots__ = ("_hash", "_terms")

    def __init__(self, terms: tuple[tuple[Monomial, int], ...]) -> None:
        # Private: callers get SymDims from sym(), parse_dim() and arithmetic, which canonicalise.
        self._terms = terms
        self._hash = hash(terms)

    # -- construction -------------------------------------------------------------------------------------
    @staticmethod
    def _from_terms(terms: dict[Monomial, int]) -> Dim:
        terms = _multiples_of_quotients_as_remainders(terms)
        kept = tuple(sorted(((m, c) for m, c in terms.items() if c), key=lambda mc: _mono_key(mc[0])))
        if not kept:
            return 0
        if len(kept) == 1 and kept[0][0] == ():
            return kept[0][1]
        extreme = _extreme_to_distribute(kept)
        if extreme is not None:
            return extreme
        out = SymDim(kept)
        period = _period(out)
        if period is not None:
            values = _evaluate_periodic(out, period)
            if values is not None and values.size and values.min() == values.max():
                return int(values[0])  # n%2 + 1 - (n%2 + 1)//2 is 1 for every n
        return out

    # -- queries ------------------------------------------------------------------------------------------
    @property
    def free_symbols(self) -> frozenset[str]:
        out: set[str] = set()
        for mono, _ in self._terms:
            for atom in mono:
                if atom.kind == "sym":
                    out.add(atom.name)
                for a in atom.args:
                    out |= free_symbols(a)
        return frozenset(out)

    def _describe(self) -> str:
        names = sorted(self.free_symbols)
        if names == [str(self)]:
            return f"symbolic dimension {names[0]!r}"
        which = "symbol" if len(names) == 1 else "symbols"
        return f"symbolic dimension {str(self)!r} ({which} {', '.join(map(repr, names))})"

    # -- int-like behaviour -------------------------------------------------------------------------------
    def __int__(self) -> int:
        raise SymbolicShapeError(f"{self._describe()} used where a concrete size is needed")

    __index__ = __int__

    def __bool__(self) -> bool:
        raise SymbolicShapeError(f"{self._describe()} used as a truth value; its value is only known at run time")

    def __add__(self, other: Dim) -> Dim:
        return _add(self, other, 1)

    __radd__ = __add__

    def __sub__(self, other: Dim) -> Dim:
        return _add(self, other, -1)

    def __rsub__(self, other: Dim) -> Dim:
        return _add(_normalise(other), self, -1)

    def __neg__(self) -> Dim:
        return _mul(self, -1)

    def __pos__(self) -> SymDim:
        return self

    def __mul__(self, other: Dim) -> Dim:
        return _mul(self, other)

    __rmul__ = __mul__

    def __floordiv__(self, other: Dim) -> Dim:
        return floordiv(self, other)

    def __rfloordiv__(self, other: Dim) -> Dim:
        return floordiv(other, self)

    def __mod__(self, other: Dim) -> Dim:
        return mod(self, other)

    def __rmod__(self, other: Dim) -> Dim:
        return mod(other, self)

    # -- comparison: equality is structural (canonical form); order only when the difference is constant --
    def __eq__(self, other: object) -> bool:
        if isinstance(other, SymDim):
            return self._terms == other._terms
        if isinstance(other, int):
            return False  # a SymDim is never constant
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    def __hash__(self) -> int:
        return self._hash

    def _decide(self, other: Dim, op: str, holds: Callable[[int], bool]) -> bool:
        """Whether `self op other` for every value of the symbols: the difference is a constant, or its range
        without any bounds (remainders bound it: `-(n % 3) > 0` is false for every n) decides it."""
        diff = self - other
        low, high = (diff, diff) if isinstance(diff, int) else free_range(diff) or (None, None)
        if low is not None and high is not None and holds(low) == holds(high):
            return holds(low)  # `holds` is monotone in the difference, so its ends decide it
        raise SymbolicShapeError(f"cannot decide {self} {op} {other}: {self._describe()} is only known at run time")

    def __lt__(self, other: Dim) -> bool:
        return self._decide(other, "<", lambda d: d < 0)

    def __le__(self, other: Dim) -> bool:
        return self._decide(other, "<=", lambda d: d <= 0)

    def __gt__(self, other: Dim) -> bool:
        return self._decide(other, ">", lambda d: d > 0)

    def __ge__(self, other: Dim) -> bool:
        return self._decide(other, ">=", lambda d: d >= 0)

    # -- text -----------------------------------------------------------------------------------------------
    def __str__(self) -> str:
        parts: list[str] = []
        for mono, coeff in self._terms:
            factors = [_atom_text(a) for a in mono]
            magnitude = abs(coeff)
            if not factors:
                body = str(magnitude)
            elif magnitude == 1:
                body = "*".join(factors)
            else:
                body = "*".join([str(magnitude), *factors])
            if not parts:
                parts.append(body if coeff > 0 else f"-{body}")
            else:
                parts.append(f"{'+' if coeff > 0 else '-'} {body}")
        return " ".join(parts)

    def __repr__(self) -> str:
        return f"SymDim({str(self)!r})"

    def to_json(self) -> dict[str, str]:
        return {"sym": str(self)}

    # Immutable: copies are the object itself; pickling goes through the text form.
    def __copy__(self) -> SymDim:
        return self

    def __deepcopy__(self, memo: dict[int, object]) -> SymDim:
        return self

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (_from_text, (str(self),))


def _mono_key(mono: Monomial) -> tuple[bool, int, tuple[str, ...]]:
    # The constant term last, so dimensions read the usual way: "h - 3", "2*seq + 1".
    return (not mono, len(mono), tuple(a.key() for a in mono))


def _terms_of(d: Dim) -> dict[Monomial, int]:
    if isinstance(d, SymDim):
        return dict(d._terms)
    if isinstance(d, bool):
        raise TypeError("a dimension must be an int or a SymDim, got bool")
    value = operator.index(d)  # numpy integers are welcome; floats are not
    return {(): value} if value else {}


def _integral(d: object) -> bool:
    return isinstance(d, (int, SymDim, np.integer)) and not isinstance(d, bool)


def _normalise(d: Dim) -> Dim:
    return SymDim._from_terms(_terms_of(d))


def _add(a: Dim, b: Dim, sign: int) -> Dim:
    if not _integral(b):
        return NotImplemented  # type: ignore[return-value]
    terms = _terms_of(a)
    for mono, coeff in _terms_of(b).items():
        terms[mono] = terms.get(mono, 0) + sign * coeff
    return SymDim._from_terms(terms)


def _mul(a: Dim, b: Dim) -> Dim:
    if not _integral(b):
        return NotImplemented  # type: ignore[return-value]
    terms: dict[Monomial, int] = {}
    for ma, ca in _terms_of(a).items():
        for mb, cb in _terms_of(b).items():
            mono = tuple(sorted(ma + mb, key=_Atom.key))
            terms[mono] = terms.get(mono, 0) + ca * cb
    return SymDim._from_terms(terms)


def _from_text(text: str) -> Dim:
    from edgerun.ir.symbolic_text import parse_dim  # the parser builds SymDims, so it imports this module

    return parse_dim(text)


def _single_atom(d: Dim) -> _Atom | None:
    """The atom when d is exactly one atom (coefficient 1, no other term), else None."""
    if isinstance(d, SymDim) and len(d._terms) == 1 and d._terms[0][1] == 1 and len(d._terms[0][0]) == 1:
        return d._terms[0][0][0]
    return None


def _atom_dim(atom: _Atom) -> SymDim:
    return SymDim((((atom,), 1),))


# -- public constructors and operations ---------------------------------------------------------------------
def sym(name: str) -> SymDim:
    """The symbol `name` as a dimension."""
    if not isinstance(name, str) or not NAME.match(name) or name in RESERVED:
        raise SymbolicShapeError(f"invalid symbol name {name!r}: use letters, digits and '_', not starting with a "
                                 "digit, and not 'max' or 'min'")
    return _atom_dim(_Atom("sym", name))


def is_symbolic(d: object) -> bool:
    return isinstance(d, SymDim)


def as_dim(value: object) -> Dim:
    """An attribute's dimension as a Dim: SymDims pass, anything else goes through int() as rules always did."""
    return value if isinstance(value, SymDim) else int(value)  # type: ignore[call-overload]


def free_symbols(d: Dim) -> frozenset[str]:
    return d.free_symbols if isinstance(d, SymDim) else frozenset()


def floordiv(a: Dim, b: Dim) -> Dim:
    """floor(a / b), simplified where the divisor is a constant (see the canonical-form rules above)."""
    a, b = _normalise(a), _normalise(b)
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise SymbolicShapeError("division of a dimension by zero")
        return a // b
    if isinstance(b, int):
        if b == 0:
            raise SymbolicShapeError(f"division of {a} by zero")
        if b < 0:  # floor(a / -n) = floor(-a / n): one sign of divisor
            return floordiv(-a, -b)
        if b == 1:
            return a
        # a = b*P + R with R's coefficients in [0, b): floor(a / b) = P + floor(R / b).
        whole, rest = _split_by(a, b)
        if isinstance(rest, int):
            return whole + rest // b
        inner, offset = _atom_plus_constant(rest)
        if inner is not None and inner.kind == "floordiv" and isinstance(inner.args[1], int):
            # floor((floor(x / m) + k) / n) = floor(floor((x + k m) / m) / n) = floor((x + k m) / (m n)).
            m = inner.args[1]
            return whole + floordiv(inner.args[0] + offset * m, m * b)
        if inner is not None and inner.kind == "mod" and isinstance(inner.args[1], int) \
                and inner.args[1] - 1 + offset < b:
            return whole  # 0 <= x % m + k < n: the quotient is 0
        return whole + _atom_dim(_Atom("floordiv", args=(rest, b)))
    quotient = exact_quotient(a, b)
    if quotient is not None:
        return quotient
    return _atom_dim(_Atom("floordiv", args=(a, b)))


def _split_by(a: Dim, n: int) -> tuple[Dim, Dim]:
    """(P, R) with a = n*P + R and every coefficient of R (its constant too) in [0, n), for n > 0."""
    whole: dict[Monomial, int] = {}
    rest: dict[Monomial, int] = {}
    for mono, coeff in _terms_of(a).items():
        whole[mono], rest[mono] = divmod(coeff, n)
    return SymDim._from_terms(whole), SymDim._from_terms(rest)


def _atom_plus_constant(d: Dim) -> tuple[_Atom | None, int]:
    """(atom, k) when d is exactly `atom + k`, else (None, 0)."""
    if not isinstance(d, SymDim):
        return None, 0
    terms = _terms_of(d)
    k = terms.pop((), 0)
    if len(terms) != 1:
        return None, 0
    ((mono, coeff),) = terms.items()
    return (mono[0], k) if coeff == 1 and len(mono) == 1 else (None, 0)


def exact_quotient(a: Dim, b: Dim) -> Dim | None:
    """a / b when b is one term (c * monomial) that divides every term of a exactly, else None.

    Enough for the element counts of reshapes: (batch*seq*32) / (batch*seq) = 32.
    """
    a, b = _normalise(a), _normalise(b)
    divisor = _terms_of(b)
    if len(divisor) != 1:
        return None
    ((mono_b, coeff_b),) = divisor.items()
    out: dict[Monomial, int] = {}
    for mono, coeff in _terms_of(a).items():
        rest = list(mono)
        for atom in mono_b:
            if atom not in rest:
                return None
            rest.remove(atom)
        if coeff % coeff_b:
            return None
        out[tuple(rest)] = coeff // coeff_b
    return SymDim._from_terms(out)


def mod(a: Dim, b: Dim) -> Dim:
    """a mod b (Python's sign convention), simplified where b is a constant (see the canonical-form rules)."""
    a, b = _normalise(a), _normalise(b)
    if isinstance(a, int) and isinstance(b, int):
        if b == 0:
            raise SymbolicShapeError("modulo of a dimension by zero")
        return a % b
    if isinstance(b, int):
        if b == 0:
            raise SymbolicShapeError(f"modulo of {a} by zero")
        if b < 0:  # a mod -n = -((-a) mod n): one sign of divisor
            return -mod(-a, -b)
        if b == 1:
            return 0
        _, rest = _split_by(a, b)  # (n*P + R) mod n = R mod n
        if isinstance(rest, int):
            return rest % b
        inner, offset = _atom_plus_constant(rest)
        if inner is not None and inner.kind == "mod" and isinstance(inner.args[1], int):
            m = inner.args[1]
            if offset == 0 and m % b == 0:
                return mod(inner.args[0], b)  # (x mod m k) mod m = x mod m
            if m - 1 + offset < b:
                return rest  # 0 <= x % m + k < n (k >= 0 once reduced): already its own remainder
        return _atom_dim(_Atom("mod", args=(rest, b)))
    if exact_quotient(a, b) is not None:
        return 0
    return _atom_dim(_Atom("mod", args=(a, b)))


def _multiples_of_quotients_as_remainders(terms: dict[Monomial, int]) -> dict[Monomial, int]:
    """c*(x//n) with n dividing c becomes (c/n)*(x - x % n), so x - n*(x//n) cancels to x % n.

    Each rewrite replaces an atom by its (smaller) arguments, so repeating until none is left terminates."""
    while True:
        found = next(((mono, coeff) for mono, coeff in terms.items() if coeff and len(mono) == 1
                      and mono[0].kind == "floordiv" and isinstance(mono[0].args[1], int)
                      and mono[0].args[1] > 0 and coeff % mono[0].args[1] == 0), None)
        if found is None:
            return terms
        (atom,), coeff = found
        x, n = atom.args
        terms = {m: c for m, c in terms.items() if m != found[0]}
        for mono, c in _terms_of(x).items():
            terms[mono] = terms.get(mono, 0) + coeff // n * c
        for mono, c in _terms_of(mod(x, n)).items():
            terms[mono] = terms.get(mono, 0) - coeff // n * c


def _extreme_to_distribute(kept: tuple[tuple[Monomial, int], ...]) -> Dim | None:
    """A sum of other terms (maybe none) and c*max(a, b) (or min) as max(rest + c*a, rest + c*b), min for
    negative c: the one form of such a sum, in which terms that cancel inside the max do."""
    extremes = [(mono, coeff) for mono, coeff in kept if any(atom.kind in ("max", "min") for atom in mono)]
    if len(extremes) != 1 or len(extremes[0][0]) != 1 or (len(kept) == 1 and extremes[0][1] == 1):
        return None  # none, several, one inside a product, or the bare max itself
    ((atom,), coeff) = extremes[0]
    rest = SymDim._from_terms({m: c for m, c in kept if m != (atom,)})
    kind = atom.kind if coeff > 0 else ("min" if atom.kind == "max" else "max")
    return _extreme(kind, rest + coeff * atom.args[0], rest + coeff * atom.args[1])


def _extreme(kind: str, a: Dim, b: Dim) -> Dim:
    a, b = _normalise(a), _normalise(b)
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b) if kind == "max" else min(a, b)
    diff = a - b
    # The sign of a - b without bounds: a constant, or one that remainders bound (n % 2 + 1 > 0).
    sign = (diff, diff) if isinstance(diff, int) else free_range(diff)
    if sign is not None and (sign[0] >= 0 or sign[1] <= 0):
        return a if (sign[0] >= 0) == (kind == "max") else b
    args = tuple(sorted((a, b), key=_text))
    return _atom_dim(_Atom(kind, args=args))


def sym_max(a: Dim, b: Dim) -> Dim:
    return _extreme("max", a, b)


def sym_min(a: Dim, b: Dim) -> Dim:
    return _extreme("min", a, b)


def evaluate(d: Dim, bindings: Mapping[str, int]) -> int:
    """The value of `d` with every symbol bound; a clear error names a symbol that is not."""
    result = substitute(d, bindings)
    if isinstance(result, SymDim):
        missing = sorted(result.free_symbols)
        raise SymbolicShapeError(f"cannot evaluate {d}: no value for symbol {', '.join(map(repr, missing))}")
    return result


def substitute(d: Dim, bindings: Mapping[str, Dim]) -> Dim:
    """`d` with the bound symbols replaced (partial bindings leave the other symbols in place)."""
    if not isinstance(d, SymDim):
        return d
    total: Dim = 0
    for mono, coeff in d._terms:
        product: Dim = coeff
        for atom in mono:
            product = product * _substitute_atom(atom, bindings)
        total = total + product
    return total


def _substitute_atom(atom: _Atom, bindings: Mapping[str, Dim]) -> Dim:
    if atom.kind == "sym":
        return bindings.get(atom.name, _atom_dim(atom))
    a, b = (substitute(x, bindings) for x in atom.args)
    if atom.kind == "floordiv":
        return floordiv(a, b)
    if atom.kind == "mod":
        return mod(a, b)
    return _extreme(atom.kind, a, b)


def dim_to_json(d: Dim) -> int | dict[str, str]:
    return d.to_json() if isinstance(d, SymDim) else d


def sample_bindings(symbols: Mapping[str, tuple[int, int]], count: int = 6) -> list[dict[str, int]]:
    """Bindings spread over the bounds: all minima, all maxima, and a few points between (deterministic)."""
    names = sorted(symbols)
    out = [{n: symbols[n][0] for n in names}, {n: symbols[n][1] for n in names}]
    for k in range(count):
        out.append({n: symbols[n][0] + (symbols[n][1] - symbols[n][0]) * ((k * 7 + i * 3 + 1) % 11) // 10
                    for i, n in enumerate(names)})
    return out


def same_values(a: tuple[Dim, ...], b: tuple[Dim, ...], symbols: Mapping[str, tuple[int, int]]) -> bool:
    """Whether two shapes agree at sampled bindings within bounds: two forms of one size ((h + 1)//2 and
    (h - 1)//2 + 1) that the canonical form does not identify."""
    if len(a) != len(b):
        return False
    if any(not isinstance(x, SymDim) and not isinstance(y, SymDim) and x != y for x, y in zip(a, b)):
        return False
    for binding in sample_bindings(symbols):
        try:
            if any(evaluate(x, binding) != evaluate(y, binding) for x, y in zip(a, b)):
                return False
        except SymbolicShapeError:
            return False
    return True


# Up to this many points in one period, an expression whose symbols occur only inside remainders by
# constants (periodic in each symbol) is evaluated over a whole period: exactly, without any bounds.
PERIODIC_POINTS = 4096


def _period(d: SymDim) -> dict[str, int] | None:
    """Each symbol's period when every occurrence of it is inside `x % n` with a constant n (the lcm of
    those n), else None; None too when a period box would exceed PERIODIC_POINTS."""
    if not any(atom.kind == "mod" for mono, _ in d._terms for atom in mono):
        return None  # the common case, decided without walking the tree
    periods: dict[str, int] = {}
    if not _collect_periods(d, periods) or not periods:
        return None
    return periods if math.prod(periods.values()) <= PERIODIC_POINTS else None


def _collect_periods(d: Dim, periods: dict[str, int]) -> bool:
    """Whether `d` is periodic in each of its symbols, recording the periods. A polynomial P with integer
    coefficients has P(x + n) = P(x) mod n, so `P % n` has period n in the symbols of P; an atom of P that
    is not a symbol must be periodic itself (`(x//3) % 2` is not: x//3 is not periodic). A function of
    periodic values (a quotient, max, min, sum) is periodic with the lcm of their periods."""
    if not isinstance(d, SymDim):
        return True
    for mono, _ in d._terms:
        for atom in mono:
            if atom.kind == "sym":
                return False  # a symbol outside any remainder: not periodic
            if atom.kind == "mod" and isinstance(atom.args[1], int):
                for inner, _ in _terms_of(atom.args[0]).items():
                    for factor in inner:
                        if factor.kind == "sym":
                            periods[factor.name] = math.lcm(periods.get(factor.name, 1), atom.args[1])
                        elif not _collect_periods(_atom_dim(factor), periods):
                            return False
                continue
            if not all(_collect_periods(a, periods) for a in atom.args):
                return False
    return True


def _evaluate_periodic(d: SymDim, period: Mapping[str, int]) -> np.ndarray | None:
    axes = [np.arange(p, dtype=np.int64) for p in period.values()]
    grid = dict(zip(period, (g.reshape(-1) for g in np.meshgrid(*axes, indexing="ij"))))
    return _evaluate_array(d, grid)


def free_range(d: SymDim) -> tuple[int, int] | None:
    """Bounds on `d` that hold for every integer value of its symbols, whatever their bounds: exact for an
    expression periodic in its symbols (see _period), else by interval arithmetic, in which only remainders
    by constants have a range; None when unbounded."""
    period = _period(d)
    if period is not None:
        values = _evaluate_periodic(d, period)
        if values is not None and values.size:
            return int(values.min()), int(values.max())
    return _interval(d, {})


# Up to this many points in the symbols' box, value_range evaluates every one (vectorised): exact, where
# interval arithmetic loses the correlation between atoms over one symbol (x - min(x + 1, 0), h - 2*(h//2)).
EXACT_RANGE_POINTS = 1 << 16


def value_range(d: Dim, symbols: Mapping[str, tuple[int, int]]) -> tuple[int, int] | None:
    """Inclusive bounds containing every value of `d` with its symbols within `symbols`; None when a symbol
    is unbounded or a divisor can be 0. Exact when the symbols' box holds at most EXACT_RANGE_POINTS points,
    else interval arithmetic (possibly wider than the exact range, never narrower). Lets a frontend decide
    `d == 1` or `d < 0` for every shape a program accepts."""
    if not isinstance(d, SymDim):
        return int(d), int(d)
    names = sorted(d.free_symbols)
    interval = _interval(d, symbols)
    if all(n in symbols for n in names) and (interval is None or max(map(abs, interval)) < 1 << 62):
        points = 1
        for n in names:
            points *= max(symbols[n][1] - symbols[n][0] + 1, 0)
        if points <= EXACT_RANGE_POINTS:  # int64 cannot overflow: the interval bounds every value
            return _exact_range(d, {n: symbols[n] for n in names})
    return interval


def _exact_range(d: SymDim, symbols: Mapping[str, tuple[int, int]]) -> tuple[int, int] | None:
    axes = [np.arange(low, high + 1, dtype=np.int64) for low, high in symbols.values()]
    grid = dict(zip(symbols, (g.reshape(-1) for g in np.meshgrid(*axes, indexing="ij"))))
    values = _evaluate_array(d, grid)
    if values is None or values.size == 0:
        return None
    return int(values.min()), int(values.max())


def _evaluate_array(d: Dim, grid: Mapping[str, np.ndarray]) -> np.ndarray | None:
    """`d` at every point of `grid` (one array per symbol); None when a divisor is 0 at some point."""
    if not isinstance(d, SymDim):
        return np.full(len(next(iter(grid.values()))), d, np.int64)
    total = np.zeros(len(next(iter(grid.values()))), np.int64)
    for mono, coeff in d._terms:
        term = np.full_like(total, coeff)
        for atom in mono:
            value = grid[atom.name] if atom.kind == "sym" else _evaluate_atom_array(atom, grid)
            if value is None:
                return None
            term = term * value
        total = total + term
    return total


def _evaluate_atom_array(atom: _Atom, grid: Mapping[str, np.ndarray]) -> np.ndarray | None:
    a, b = (_evaluate_array(x, grid) for x in atom.args)
    if a is None or b is None:
        return None
    if atom.kind in ("max", "min"):
        return np.maximum(a, b) if atom.kind == "max" else np.minimum(a, b)
    if np.any(b == 0):
        return None
    return np.floor_divide(a, b) if atom.kind == "floordiv" else np.mod(a, b)


def _interval(d: Dim, symbols: Mapping[str, tuple[int, int]]) -> tuple[int, int] | None:
    """Interval arithmetic over the canonical form: each atom's range from its arguments' ranges."""
    if not isinstance(d, SymDim):
        return int(d), int(d)
    low = high = 0
    for mono, coeff in d._terms:
        term: tuple[int, int] | None = (coeff, coeff)
        for atom in mono:
            r = _atom_range(atom, symbols)
            if r is None or term is None:
                return None
            corners = [a * b for a in term for b in r]
            term = (min(corners), max(corners))
        assert term is not None
        low, high = low + term[0], high + term[1]
    return low, high


def _atom_range(atom: _Atom, symbols: Mapping[str, tuple[int, int]]) -> tuple[int, int] | None:
    if atom.kind == "sym":
        return symbols.get(atom.name)
    if atom.kind == "mod" and isinstance(atom.args[1], int):
        # Canonical constant divisors are positive: 0 <= a mod n < n whatever a is (and <= a when a >= 0).
        dividend = _interval(atom.args[0], symbols)
        top = atom.args[1] - 1 if dividend is None or dividend[0] < 0 else min(atom.args[1] - 1, dividend[1])
        return 0, top
    ranges = [_interval(a, symbols) for a in atom.args]
    if any(r is None for r in ranges):
        return None
    (al, ah), (bl, bh) = ranges  # type: ignore[misc]
    if atom.kind in ("max", "min"):
        pick = max if atom.kind == "max" else min
        return pick(al, bl), pick(ah, bh)
    if bl <= 0 <= bh:
        return None
    if atom.kind == "mod":  # Python's sign convention: the result has the divisor's sign
        return (0, bh - 1) if bl > 0 else (bl + 1, 0)
    # floor(a / b) is monotone in a, and in b while b keeps its sign: the extremes are at the corners.
    corners = [a // b for a in (al, ah) for b in (bl, bh)]
    return min(corners), max(corners)


def fixed_by_bounds(d: Dim, symbols: Mapping[str, tuple[int, int]]) -> Dim:
    """`d` as the number it is at every size the symbols' bounds allow, else `d` unchanged: a quotient such as
    `(L + 15)//48` is 1 for every L in 33..80, which the canonical form (bounds-free) cannot know but a
    relation proved over those bounds needs (a Reshape by it). Only forms with a quotient, remainder, max or
    min are tried: a polynomial in symbols whose bounds leave room is never one number."""
    if not isinstance(d, SymDim) or all(atom.kind == "sym" for mono, _ in d._terms for atom in mono):
        return d
    if not d.free_symbols <= symbols.keys():
        return d
    bounds = _interval(d, symbols)  # cheap (this runs on every template node built), never narrower than the truth
    return bounds[0] if bounds is not None and bounds[0] == bounds[1] else d


def upper_bound(d: Dim, symbols: Mapping[str, tuple[int, int]]) -> int:
    """The largest value of `d` within the symbols' bounds, for forms that grow with every symbol (a sum of
    products of symbols with positive coefficients); others raise, since their maximum is not at a corner."""
    if not isinstance(d, SymDim):
        return d
    for mono, coeff in d._terms:
        if mono and (coeff < 0 or any(atom.kind != "sym" for atom in mono)):
            raise SymbolicShapeError(f"cannot bound {d}: only sums of products of symbols have their largest "
                                     "value at the symbols' upper bounds")
    return evaluate(d, {name: high for name, (_, high) in symbols.items()})
