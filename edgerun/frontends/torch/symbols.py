"""torch.export's symbolic sizes as edgerun SymDims, named after the user's `torch.export.Dim`s.

torch names its size symbols s0, s27, ...; a program should say "batch" and "seq". The user's
`dynamic_shapes` tells which input dimension each Dim is, the exported placeholders tell which torch symbol
that dimension became, and `range_constraints` gives the bounds torch settled on (the user's, possibly
narrowed by the model). Every size expression torch records (sympy, in `node.meta["val"]`) converts to a
SymDim over those names; a symbol without a user name (data-dependent sizes) is refused.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from edgerun.errors import EdgerunError
from edgerun.ir.symbolic import Dim, SymbolicShapeError, floordiv, mod, sym, sym_max, sym_min

# A Dim whose max is at least this is unbounded: we need a bound to plan memory for the largest shape.
_UNBOUNDED = 1 << 62


class DynamicShapesError(EdgerunError):
    """`dynamic_shapes` that edgerun cannot take (an unbounded Dim, an automatic hint, a nested input)."""


def check_dynamic_shapes(dynamic_shapes: Any) -> None:
    """Every Dim has a finite max; automatic hints (Dim.AUTO, Dim.DYNAMIC) are refused."""
    for where, dim in _walk(dynamic_shapes, "dynamic_shapes"):
        if type(dim).__name__ == "_DimHint":
            raise DynamicShapesError(f"{where} is {dim}: edgerun needs named, bounded dimensions; use "
                                     "torch.export.Dim(name, min=..., max=...)")
        root = getattr(dim, "root", dim)  # a derived Dim (2*seq) is bounded by its root
        high = getattr(root, "max", None)
        if high is None or not _is_finite(high) or int(high) >= _UNBOUNDED:
            raise DynamicShapesError(
                f"{where}: torch.export.Dim({root.__name__!r}) has no max; edgerun plans memory for each shape "
                f"within bounds and needs one: torch.export.Dim({root.__name__!r}, min=..., max=...)")


def _is_finite(value: Any) -> bool:
    try:
        int(value)
    except Exception:  # sympy's infinities raise OverflowError, AttributeError, TypeError by version
        return False
    return True


def _walk(obj: Any, where: str) -> list[tuple[str, Any]]:
    if obj is None or isinstance(obj, int):
        return []
    if isinstance(obj, Mapping):
        return [x for k, v in obj.items() for x in _walk(v, f"{where}[{k!r}]")]
    if isinstance(obj, (list, tuple)):
        return [x for i, v in enumerate(obj) for x in _walk(v, f"{where}[{i}]")]
    return [(where, obj)]


def per_input_specs(module: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None,
                    dynamic_shapes: Any) -> list[Any]:
    """The dynamic_shapes entry of each tensor input, in the order torch.export lists user inputs."""
    names = list(inspect.signature(module.forward).parameters)
    if isinstance(dynamic_shapes, Mapping):
        by_position = [dynamic_shapes.get(n) for n in names[:len(args)]]
        by_keyword = [dynamic_shapes.get(k) for k in (kwargs or {})]
    elif isinstance(dynamic_shapes, (list, tuple)):
        if len(dynamic_shapes) != len(args) + len(kwargs or {}):
            raise DynamicShapesError(f"dynamic_shapes has {len(dynamic_shapes)} entries for "
                                     f"{len(args) + len(kwargs or {})} inputs")
        by_position, by_keyword = list(dynamic_shapes[:len(args)]), list(dynamic_shapes[len(args):])
    else:
        raise DynamicShapesError("dynamic_shapes must be a tuple (one entry per input) or a dict by input name")
    specs = by_position + by_keyword
    for value, spec in zip([*args, *(kwargs or {}).values()], specs):
        if spec is not None and not hasattr(value, "shape"):
            raise DynamicShapesError("dynamic_shapes can only name dimensions of tensor inputs, not of nested "
                                     "or Python inputs")
    return specs


def symbol_names(ep: Any, user_inputs: list[Any], specs: list[Any]) -> tuple[dict[str, str], dict[str, tuple[int, int]]]:
    """(torch symbol name -> user name, user name -> (min, max)) from the exported placeholders."""
    names: dict[str, str] = {}
    for node, spec in zip(user_inputs, specs):
        if spec is None:
            continue
        entries = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
        shape = node.meta["val"].shape
        for axis, dim in entries:
            if dim is None:
                continue
            expr = getattr(shape[int(axis)], "node", None)
            expr = getattr(expr, "expr", None)
            root = getattr(dim, "root", None)
            if root is not None and expr is not None and len(getattr(expr, "free_symbols", ())) == 1:
                # A derived Dim (4*h) is an expression over its root's symbol, which no input may carry alone.
                expr, dim = next(iter(expr.free_symbols)), root
            if expr is not None and getattr(expr, "is_Symbol", False):
                known = names.get(str(expr))
                if known is not None and known != dim.__name__:
                    raise DynamicShapesError(f"torch.export made Dims {known!r} and {dim.__name__!r} one symbol "
                                             "(the model requires them equal): use one Dim for both")
                names[str(expr)] = dim.__name__
    bounds: dict[str, tuple[int, int]] = {}
    for symbol, vr in ep.range_constraints.items():
        if str(symbol) in names:
            lo, hi = vr.lower, vr.upper
            if not _is_finite(hi) or int(hi) >= _UNBOUNDED:
                raise DynamicShapesError(f"dimension {names[str(symbol)]!r} has no upper bound after export")
            bounds[names[str(symbol)]] = (max(int(lo), 0), int(hi))
    return names, bounds


def to_dim(value: Any, names: Mapping[str, str]) -> Dim:
    """A torch size (int, SymInt, or sympy expression) as an edgerun Dim over the user's names."""
    if isinstance(value, int):
        return value
    node = getattr(value, "node", None)
    return sympy_to_dim(node.expr if node is not None else value, names)


def sympy_to_dim(expr: Any, names: Mapping[str, str]) -> Dim:
    kind = type(expr).__name__
    if getattr(expr, "is_Integer", False):
        return int(expr)
    if getattr(expr, "is_Symbol", False):
        name = names.get(str(expr))
        if name is None:
            raise SymbolicShapeError(f"size symbol {expr} is not one of the exported dimensions (a size that "
                                     "depends on tensor values, which edgerun programs cannot have)")
        return sym(name)
    args = [sympy_to_dim(a, names) for a in getattr(expr, "args", ())]
    if kind == "Add":
        total: Dim = 0
        for a in args:
            total = total + a
        return total
    if kind == "Mul":
        product: Dim = 1
        for a in args:
            product = product * a
        return product
    if kind == "Pow" and isinstance(args[1], int) and args[1] >= 0:
        power: Dim = 1
        for _ in range(args[1]):
            power = power * args[0]
        return power
    if kind in ("FloorDiv", "CleanDiv"):
        return floordiv(args[0], args[1])
    if kind == "CeilDiv":
        return -floordiv(-args[0], args[1])
    if kind in ("Mod", "PythonMod"):
        return mod(args[0], args[1])
    if kind in ("Max", "Min"):
        result = args[0]
        for a in args[1:]:
            result = sym_max(result, a) if kind == "Max" else sym_min(result, a)
        return result
    raise SymbolicShapeError(f"torch size expression {expr} ({kind}) has no edgerun form")
