"""The shapes of an ONNX model's inputs: the model's own sizes, sizes pinned by `input_shapes`, and bounded symbols.

`input_shapes={"x": (1, 3, ("H", 32, 2048), ("W", 32, 2048))}`: an int pins a dimension, a `(name, min, max)`
tuple declares a symbol with inclusive bounds, and `(name, min, max, multiple)` one whose sizes are multiples
(`("H", 32, 2048, 32)`: the dimension is `32*H_div32`, for models that only work on such sizes). The program is then a template that serves every shape in the
bounds (the runtime specialises it per concrete shape), planned for the bounds upfront.

A dynamic dimension nobody sized imports too (`unsized="symbols"`, the default): it becomes a symbol named after
its `dim_param` (or `<input>_<axis>` for an anonymous one) bounded 1..DYNAMIC_MAX, bounds that only say "any
size"; the runtime checks each call's sizes and specialises the program at the first call of each new size
(cached). Where the model holds together only on multiples (a detector that halves H five times and doubles it
back), the importer retries with those dimensions as multiples (`multiple=`), the smallest that imports, so a
size that is no multiple is refused at its call with that reason. `unsized="refuse"` instead refuses such a
dimension with the form to pass (DynamicInputError), for a caller who wants every size stated.

A wrong `input_shapes` entry (an input the model lacks, a wrong rank, bad bounds) is an InputShapeError, which
says it in from_onnx's terms, or in the CLI's (`--input-shape`) through `cli_message()`.

A dynamic dimension of an input not listed (or of a listed input's ONNX `dim_param`) takes the symbol declared
for the same `dim_param` elsewhere: `input_shapes={"input": (("batch", 1, 8), ("sequence", 64, 4096))}` also
gives silero-vad's `state` input, declared `(2, 'batch', 128)`, the symbol `batch`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgerun.errors import UnsupportedOpError
from edgerun.frontends.onnx.context import OnnxModelError
from edgerun.frontends.onnx.dims import anonymous_symbol, describe
from edgerun.ir.symbolic import Dim, SymbolicShapeError, sym

# What input_shapes holds per dimension: a size, (symbol, min, max), or (symbol, min, max, multiple).
InputDim = int | tuple[str, int, int] | tuple[str, int, int, int]

# The upper bound of a dimension nobody bounded (unsized="symbols"): "any size" (2^24 along one axis), so the
# bound never decides whether a real call runs; each call's sizes are specialised for as they come.
DYNAMIC_MAX = 1 << 24
UNSIZED = ("refuse", "symbols")


class InputShapeError(OnnxModelError):
    """A shape given for an input that does not fit the model or is malformed. `str()` says it in from_onnx's
    terms (input_shapes=); `cli_message()` in the CLI's (--input-shape), for whoever gave it there."""

    def __init__(self, name: str, axis: int | None, python: str, cli: str | None = None) -> None:
        where = f"input_shapes[{name!r}]" + ("" if axis is None else f" dimension {axis}")
        super().__init__(f"{where} {python}")
        self.name, self.axis = name, axis
        self._cli = f"--input-shape {name}=...: " + ("" if axis is None else f"dimension {axis} ") + (cli or python)

    def cli_message(self) -> str:
        return self._cli


@dataclass
class DeclaredInputs:
    """Each graph input's shape (ints and symbols), the symbols' bounds, and what ONNX's names stand for."""

    shapes: dict[str, tuple[Dim, ...]] = field(default_factory=dict)
    symbols: dict[str, tuple[int, int]] = field(default_factory=dict)
    # An ONNX dim_param of an input -> the size or symbol it was given; the cross-check holds ONNX to it.
    bindings: dict[str, Dim] = field(default_factory=dict)
    conflicting: set[str] = field(default_factory=set)  # dim_params given two different sizes: name nothing
    rewritten: bool = False  # some input's declared dimensions differ from the model's
    # Symbols made for dynamic dimensions nobody sized (unsized="symbols"), in declaration order.
    defaulted: list[str] = field(default_factory=list)

    def apply(self, model: Any, constants: Mapping[str, tuple[int, ...]] | None = None) -> Any:
        """A copy of `model` whose inputs declare these shapes (symbols as dim_params), for ONNX's inference;
        inputs frozen to constants declare the constants' shapes."""
        import onnx

        model = onnx.ModelProto.FromString(model.SerializeToString())
        # value_info the exporter stored describes the shapes it saw (often batch 1); ONNX's inference recomputes
        # it from the declared inputs, so a stale declaration cannot fail the cross-check.
        del model.graph.value_info[:]
        shapes: dict[str, tuple[Dim, ...]] = {**self.shapes, **(constants or {})}
        for vi in model.graph.input:
            dims = vi.type.tensor_type.shape.dim
            if vi.name not in shapes or len(dims) != len(shapes[vi.name]):
                continue
            for d, size in zip(dims, shapes[vi.name]):
                d.Clear()
                if isinstance(size, int):
                    d.dim_value = size
                else:
                    d.dim_param = str(size)
        return model


def declare_inputs(inputs: Sequence[Any], input_shapes: Mapping[str, Sequence[Any]],
                   skip: set[str], unsized: str = "symbols", multiple: int = 1) -> DeclaredInputs:
    """Resolve every tensor input's shape from the model and `input_shapes`; inputs in `skip` are constants.

    `unsized="symbols"` (the default) makes each dynamic dimension left without a size or symbol a symbol bounded
    1..DYNAMIC_MAX; with `multiple` > 1, each such dimension past an input's first (its batch) is that multiple
    of a symbol. Raises OnnxModelError for an input_shapes entry that names no input, has the wrong rank, or a
    malformed dimension (InputShapeError), and with unsized="refuse" DynamicInputError for a dynamic dimension left
    without a size or bounded symbol (naming the form to pass).
    """
    by_name = {vi.name: vi for vi in inputs}
    for name in input_shapes:
        if name not in by_name:
            raise InputShapeError(name, None, f"names no graph input (the model's are {sorted(by_name)})")
    out = DeclaredInputs()
    tensors = [vi for vi in inputs if vi.name not in skip and vi.type.WhichOneof("value") == "tensor_type"
               and vi.type.tensor_type.HasField("shape")]
    # Listed inputs first, so their symbols are known when an unlisted input shares a dim_param.
    for vi in sorted(tensors, key=lambda v: v.name not in input_shapes):
        dims = list(vi.type.tensor_type.shape.dim)
        given = input_shapes.get(vi.name)
        if given is not None and len(given) != len(dims):
            raise InputShapeError(vi.name, None, f"has {len(given)} dimensions, the model's input {len(dims)}")
        shape: list[Dim] = []
        unresolved: list[int] = []
        for i, d in enumerate(dims):
            size = _resolve(vi.name, i, d, None if given is None else given[i], out)
            if size is None and unsized == "symbols":
                size = _dynamic(vi.name, i, d, out, multiple if i > 0 else 1)
            if size is None:
                unresolved.append(i)
                size = 0
            shape.append(size)
        if unresolved:
            raise DynamicInputError(vi.name, list(describe(dims)), unresolved)
        declared = [int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else None for d in dims]
        out.rewritten |= any(s != d for s, d in zip(shape, declared))
        out.shapes[vi.name] = tuple(shape)
    return out


def _resolve(input_name: str, i: int, d: Any, given: Any, out: DeclaredInputs) -> Dim | None:
    """One input dimension's size or symbol (None when it is dynamic and nothing bounds it)."""
    param = d.dim_param if d.HasField("dim_param") and not anonymous_symbol(d.dim_param) else ""
    static = int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else None
    if given is None:
        if static is not None:
            return static
        if param in out.bindings:
            return out.bindings[param]
        if param in out.symbols:
            return sym(param)
        return None
    if isinstance(given, bool):
        raise InputShapeError(input_name, i, f"is {given!r}: give a size or (name, min, max)",
                              f"is {given!r}: give a size or SYMBOL:MIN:MAX")
    if isinstance(given, int) or (hasattr(given, "__index__") and not isinstance(given, tuple | list | str)):
        size = int(given)
        if size < 0:
            raise InputShapeError(input_name, i, f"is {size}: sizes are non-negative")
        if static is not None and size != static:
            raise InputShapeError(input_name, i, f"is {size}, but the model fixes that dimension to {static}")
        if param:
            _bind(out, param, size)
        return size
    symbol = _symbol(given, input_name, i, out)
    if static is not None:
        raise InputShapeError(input_name, i, f"declares symbol {given[0]!r}, but the model fixes that dimension to "
                              f"{static}", f"is the symbol {given[0]!r}, but the model fixes that dimension to "
                              f"{static}: give {static} there")
    if param:
        _bind(out, param, symbol)
    return symbol


def _symbol(given: Any, input_name: str, i: int, out: DeclaredInputs) -> Dim:
    """The dimension for (name, min, max) or (name, min, max, multiple); a multiple m makes it m * name_div<m>."""
    form = "(name, min, max), e.g. ('H', 32, 2048), or (name, min, max, multiple)"
    if isinstance(given, str):
        raise InputShapeError(input_name, i, f"is the symbol {given!r} without bounds: give {form} (or a size)",
                              f"is the symbol {given!r} without bounds: give SYMBOL:MIN:MAX (or a size)")
    if not isinstance(given, tuple | list) or len(given) not in (3, 4):
        raise InputShapeError(input_name, i, f"is {given!r}: give a size or {form}")
    name, lo, hi, multiple = (*given, 1) if len(given) == 3 else given
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (lo, hi, multiple)) or not 0 <= lo <= hi \
            or multiple < 1:
        raise InputShapeError(input_name, i, f"has bounds {lo!r}..{hi!r} (multiple {multiple!r}): they must be "
                              "integers with 0 <= min <= max and a multiple of at least 1",
                              f"is {name}:{lo}:{hi}" + (f":{multiple}" if len(given) == 4 else "") +
                              ": bounds must have 0 <= MIN <= MAX and a MULTIPLE of at least 1")
    if multiple > 1:
        # A model that halves a size five times and doubles it back (a U-Net, a text detector) adds the two only
        # when the size is a multiple of 32; as 32 * H_div32 the shape arithmetic cancels exactly.
        name, lo, hi = f"{name}_div{multiple}", -(-lo // multiple), hi // multiple
        if lo > hi:
            raise InputShapeError(input_name, i, f"has bounds where no multiple of {multiple} lies within "
                                  f"{given[1]}..{given[2]}")
    try:
        symbol = sym(name)
    except SymbolicShapeError as exc:
        raise InputShapeError(input_name, i, f"names a symbol that cannot be one: {exc}") from None
    if out.symbols.get(name, (lo, hi)) != (lo, hi):
        raise InputShapeError(input_name, i, f"bounds symbol {name!r} by {lo}..{hi}, elsewhere by "
                              f"{out.symbols[name][0]}..{out.symbols[name][1]}: one symbol has one pair of bounds")
    out.symbols[name] = (lo, hi)
    return symbol * multiple


def _dynamic(input_name: str, i: int, d: Any, out: DeclaredInputs, multiple: int) -> Dim:
    """A symbol for a dynamic dimension nobody sized: its dim_param's name where it has a usable one (shared
    by every input that names it), else `<input>_<axis>`."""
    param = d.dim_param if d.HasField("dim_param") and not anonymous_symbol(d.dim_param) else ""
    name = _identifier(param) or _identifier(f"{input_name}_{i}") or f"d{i}"
    fresh = f"{name}_div{multiple}" if multiple > 1 else name
    if fresh not in out.symbols:
        out.defaulted.append(fresh)
    size = _symbol((name, multiple, DYNAMIC_MAX, multiple), input_name, i, out)
    if param:
        _bind(out, param, size)
    return size


def _identifier(text: str) -> str:
    """`text` as a symbol name (letters, digits, underscores, not starting with a digit); "" if none is left."""
    name = "".join(c if c.isalnum() or c == "_" else "_" for c in text).strip("_")
    if not name or name[0].isdigit():
        return ""
    try:
        sym(name)
    except SymbolicShapeError:
        return ""
    return name


def _bind(out: DeclaredInputs, param: str, size: Dim) -> None:
    # Paddle and others write one name for unrelated dimensions; only a consistent use names a shared size.
    if param in out.conflicting or out.bindings.get(param, size) != size:
        out.conflicting.add(param)
        out.bindings.pop(param, None)
        return
    out.bindings[param] = size


class DynamicInputError(UnsupportedOpError):
    """A graph input with dynamic dimensions that nothing sizes or bounds. Keeps the input's name, its
    dimensions as the model writes them and which are unresolved, so the CLI can say it in its own terms."""

    def __init__(self, name: str, said: list[Any], unresolved: list[int]) -> None:
        super().__init__(f"input {name}")
        self.args = (f"input {name!r}: {_unbounded_message(name, said, unresolved)}",)
        self.name, self.said, self.unresolved = name, said, unresolved

    def __str__(self) -> str:
        return str(self.args[0])

    def cli_message(self) -> str:
        """The same, with `--input-shape` as the remedy instead of from_onnx's input_shapes."""
        example = ",".join(f"D{i}" if i in self.unresolved else str(s) for i, s in enumerate(self.said))
        return (f"input {self.name!r} has {_which(self.said, self.unresolved)} with no size or bounds: pass "
                f"--input-shape {self.name}={example}, each D a size that pins it (1) or SYMBOL:MIN:MAX that keeps "
                "it dynamic within bounds (H:32:2048)")


def _which(said: list[Any], unresolved: list[int]) -> str:
    if len(unresolved) == 1:
        return f"dynamic dimension {unresolved[0]} ({said[unresolved[0]]!r})"
    return "dynamic dimensions " + ", ".join(f"{i} ({said[i]!r})" for i in unresolved)


def _unbounded_message(name: str, said: list[Any], unresolved: list[int]) -> str:
    which = (f"dimension {unresolved[0]} is dynamic ({said[unresolved[0]]!r})" if len(unresolved) == 1 else
             "dimensions " + ", ".join(f"{i} ({said[i]!r})" for i in unresolved) + " are dynamic")
    example = ", ".join(f"<dim {i}>" if i in unresolved else str(s) for i, s in enumerate(said))
    return (f"{which}, with no size or bounds: pass input_shapes={{{name!r}: ({example})}} to "
            "from_onnx (or --input-shape on the CLI), each <dim> a size that pins it or a bounded symbol "
            "(name, min, max) such as ('H', 32, 2048) that keeps it dynamic")
