"""What an ONNX dimension says, and whether the shape edgerun infers agrees with it.

ONNX shape inference (and the shapes exporters store in value_info and graph outputs) leaves many dimensions
unknown: no value, a negative value (-1, as Paddle and TensorFlow converters write), 0 written by converters
that mean "unknown", or a symbol (`dim_param`) that ONNX made up (`unk__3`) or that only names the unknown
(`?`). None of them contradicts a concrete size edgerun infers. Two known, different sizes do, and so does a
symbol that is tied to a pinned graph input dimension (`N` in an input pinned to batch 2) and a size other
than the one it was pinned to.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from edgerun.ir.symbolic import Dim

# dim_param spellings that mean "unknown", not a name shared between values.
ANONYMOUS_SYMBOLS = {"", "?", "-1", "None", "none", "unk"}


def is_unknown_value(dim_value: int) -> bool:
    """A stored dim_value that means "unknown": -1 (any negative) or 0 as some converters write it."""
    return dim_value <= 0


def anonymous_symbol(symbol: str) -> bool:
    return symbol in ANONYMOUS_SYMBOLS or symbol.startswith("unk__")


def disagreement(ours: Sequence[Dim], dims: Sequence[Any], bindings: Mapping[str, Dim]) -> str:
    """'' when the shape edgerun infers fits ONNX's dimensions, else why not (ranks, or which dimension).

    `dims` are TensorShapeProto.Dimension messages; an unknown dimension is compatible with any size. A symbolic
    dimension of ours is checked only against a dim_param that names an input's size or symbol (`bindings`):
    ONNX's own sizes come from its inference over the same symbols and cannot be more exact than ours.
    """
    if len(ours) != len(dims):
        return f"rank {len(ours)} against ONNX's rank {len(dims)}"
    for i, (size, d) in enumerate(zip(ours, dims)):
        if d.HasField("dim_value"):
            known = int(d.dim_value)
            if not is_unknown_value(known) and isinstance(size, int) and known != size:
                return f"dimension {i} is {size}, ONNX infers {known}"
        elif d.HasField("dim_param") and d.dim_param in bindings and bindings[d.dim_param] != size:
            return (f"dimension {i} is {size}, ONNX names it {d.dim_param!r}, which input_shapes gave as "
                    f"{bindings[d.dim_param]}")
    return ""


def describe(dims: Sequence[Any]) -> tuple[int | str, ...]:
    """ONNX's dimensions for a message: sizes, symbols, and '?' for a dimension with neither."""
    out: list[int | str] = []
    for d in dims:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        else:
            out.append(d.dim_param or "?")
    return tuple(out)
