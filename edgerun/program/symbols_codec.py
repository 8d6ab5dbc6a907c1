"""The JSON form of symbolic dimensions in a template program (graph section, format minor 2).

A template graph declares its symbols with bounds (`"symbols": {"seq": [1, 512]}`), and a dimension of a
value spec or an attribute may be `{"sym": "<expression>"}` (ir/symbolic.py's text form, parsed without
eval). A static graph has neither, so its bytes are exactly what a 1.1 writer produced.
"""

from __future__ import annotations

from typing import Any

from edgerun.errors import EdgerunError, ProgramFormatError
from edgerun.ir.symbolic import Dim, SymDim, free_symbols, sym
from edgerun.ir.symbolic_text import dim_from_json
from edgerun.program.format import MAX_DIM, MAX_VALUES

SYMBOLS_KEY = "symbols"


def encode_symbols(symbols: dict[str, tuple[int, int]]) -> dict[str, list[int]]:
    return {name: [int(lo), int(hi)] for name, (lo, hi) in symbols.items()}


def decode_symbols(obj: object) -> dict[str, tuple[int, int]]:
    """name -> (min, max), each a valid symbol name with 0 <= min <= max <= MAX_DIM."""
    if type(obj) is not dict or len(obj) > MAX_VALUES:
        raise ProgramFormatError(f"graph symbols must be a JSON object of at most {MAX_VALUES} entries")
    out = {}
    for name, bounds in obj.items():
        try:
            sym(name)
        except EdgerunError as e:
            raise ProgramFormatError(f"graph symbols: {e}") from None
        if (type(bounds) is not list or len(bounds) != 2 or any(type(b) is not int for b in bounds)
                or not 0 <= bounds[0] <= bounds[1] <= MAX_DIM):
            raise ProgramFormatError(f"symbol {name!r} bounds must be [min, max] integers with "
                                     f"0 <= min <= max <= {MAX_DIM}, got {str(bounds)[:80]}")
        out[name] = (bounds[0], bounds[1])
    return out


def decode_symbolic_dim(obj: object, what: str, symbols: dict[str, tuple[int, int]]) -> Dim:
    """{"sym": text} as a SymDim over declared symbols only."""
    try:
        d = dim_from_json(obj)
    except EdgerunError as e:
        raise ProgramFormatError(f"{what}: {e}") from None
    unknown = sorted(free_symbols(d) - set(symbols))
    if unknown:
        raise ProgramFormatError(f"{what} uses symbol {unknown[0]!r}, which the graph does not declare")
    return d


def decode_symbolic_attrs(value: Any, what: str, symbols: dict[str, tuple[int, int]]) -> Any:
    """Attributes with every {"sym": text} read back as a SymDim (only in graphs that declare symbols)."""
    if type(value) is dict:
        if set(value) == {"sym"}:
            return decode_symbolic_dim(value, what, symbols)
        return {k: decode_symbolic_attrs(v, f"{what}[{k!r}]", symbols) for k, v in value.items()}
    if type(value) is list:
        return [decode_symbolic_attrs(v, f"{what}[{i}]", symbols) for i, v in enumerate(value)]
    return value


def is_symbolic_dim(d: object) -> bool:
    return isinstance(d, SymDim)
