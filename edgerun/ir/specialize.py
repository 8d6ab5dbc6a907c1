"""Specialisation of a template graph: bind its symbols from concrete input shapes, then substitute them.

A template (a graph with `symbols`) is specialised per concrete shape, as MNN resizes a session: the
bindings come from the inputs (checked against each symbol's bounds and for consistency between inputs),
and every symbolic dimension in the specs and attributes is replaced by its value. The result is an
ordinary static graph, which the normal pipeline (decomposition, folding, raster merging, memory planning)
then treats exactly like an exported one.

A template may also depend on the *values* of a few small inputs (value_key below): the key a call's values
give, and the size limit on such inputs, are here; the frontend that folds the values in is the ONNX one
(frontends/onnx/value_template.py), and the runtime caches per (values, bindings).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.ir.graph import Graph, Node
from edgerun.ir.registry import get_op
from edgerun.ir.symbolic import Dim, SymDim, as_dim, evaluate, free_symbols, substitute, sym
from edgerun.ir.tensor_spec import TensorSpec


class ShapeBindingError(EdgerunError):
    """Input shapes that do not fit a template program: wrong rank, a static size, a bound, or two values
    for one symbol. The message names the input, the dimension and the symbol."""


def bind_symbols(graph: Graph, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """Each symbol's value from the input shapes, checked against its bounds and every other use of it."""
    bindings: dict[str, int] = {}
    bound_at: dict[str, str] = {}
    derived: list[tuple[str, int, Dim, int]] = []
    for name in graph.inputs:
        spec = graph.specs[name]
        shape = tuple(shapes[name])
        if len(shape) != spec.rank:
            raise ShapeBindingError(f"input {name!r} has rank {len(shape)} (shape {shape}), the program takes "
                                    f"rank {spec.rank} ({spec})")
        for axis, (want, got) in enumerate(zip(spec.shape, shape)):
            got = int(got)
            where = f"input {name!r} dimension {axis}"
            if not isinstance(want, SymDim):
                if want != got:
                    raise ShapeBindingError(f"{where} is {got}, the program needs {want} ({spec})")
                continue
            symbols = free_symbols(want)
            text = str(want)
            if len(symbols) == 1 and text in symbols:  # the dimension is the symbol itself
                if text in bindings and bindings[text] != got:
                    raise ShapeBindingError(f"{where} is {got}, but symbol {text!r} is already {bindings[text]} "
                                            f"from {bound_at[text]}: one symbol, two values")
                low, high = graph.symbols[text]
                if not low <= got <= high:
                    raise ShapeBindingError(f"{where} is {got}: symbol {text!r} must be within [{low}, {high}] "
                                            "(the bounds the program was exported with)")
                bindings[text] = got
                bound_at[text] = f"{where}"
            else:
                derived.append((name, axis, want, got))
    for name, axis, want, got in derived:  # a symbol seen only as a multiple (32*H_div32) binds from it
        scaled = _scaled_symbol(want) if isinstance(want, SymDim) else None
        if scaled is None or scaled[0] in bindings:
            continue
        text, factor = scaled
        where = f"input {name!r} dimension {axis}"
        if got % factor:
            raise ShapeBindingError(f"{where} is {got}: the program needs a multiple of {factor} ({want})")
        low, high = graph.symbols[text]
        if not low <= got // factor <= high:
            raise ShapeBindingError(f"{where} is {got}: {want} must be within [{low * factor}, {high * factor}] "
                                    f"(symbol {text!r} within [{low}, {high}], the bounds the program was "
                                    "exported with)")
        bindings[text] = got // factor
    for name, axis, want, got in derived:  # expressions (2*seq) are checked once their symbols are known
        missing = sorted(free_symbols(want) - set(bindings))
        if missing:
            raise ShapeBindingError(f"input {name!r} dimension {axis} is {want}, but no input dimension is "
                                    f"symbol {missing[0]!r} alone, so it cannot be bound")
        value = evaluate(want, bindings)
        if value != got:
            raise ShapeBindingError(f"input {name!r} dimension {axis} is {got}, but the program needs {want} = "
                                    f"{value} with {_describe(bindings)}")
    unbound = sorted(set(graph.symbols) - set(bindings))
    if unbound:
        raise ShapeBindingError(f"symbol {unbound[0]!r} is used by no input dimension, so no call can bind it")
    check_guards(graph, bindings)
    return bindings


def guards(graph: Graph) -> list[tuple[str, Dim, Dim]]:
    """What the graph assumes of its symbols beyond their bounds: (origin, a size, the size it must equal) for
    each guarded node of the top level. A guarded reshape (attr guard) moves as many elements as its target
    holds only at some sizes; the import recorded it rather than refusing the model."""
    found = []
    for node in graph.nodes:
        if node.op == "reshape" and node.attrs.get("guard"):
            target = math.prod(as_dim(d) for d in node.attrs["shape"])
            found.append((str(node.attrs["guard"]), graph.specs[node.inputs[0]].numel, target))
    return found


def check_guards(graph: Graph, bindings: Mapping[str, int]) -> None:
    """Refuse bindings at which a guard of the graph fails, naming the node, both sizes and the bindings.

    A guard inside a cond branch holds only where that branch runs: the cond passes while one branch's guards
    hold (specialize leaves the other out, so taking it is the run-time error an unimportable branch gives);
    a loop's body runs, so its guards must hold."""
    for origin, size, must_equal in guards(graph):
        got, want = evaluate(size, bindings), evaluate(must_equal, bindings)
        if got != want:
            raise ShapeBindingError(f"the model cannot run at these sizes ({_describe(bindings)}): {origin} needs "
                                    f"{size} = {must_equal}, here {got} against {want} (a relation the import "
                                    "could not prove for every size, so each new size is checked)")
    for node in graph.nodes:
        failed = _failed_bodies(node, graph, bindings)
        present = [key for key in _body_keys(node) if node.attrs[key] != ""]
        if failed and (node.op != "cond" or len(failed) == len(present)):
            raise next(iter(failed.values()))


def _body_keys(node: Node) -> tuple[str, ...]:
    return get_op(node.op).bodies


def _failed_bodies(node: Node, graph: Graph, bindings: Mapping[str, int]) -> dict[str, ShapeBindingError]:
    """The attr keys of `node`'s bodies whose guards fail at `bindings`, with the failure."""
    failed = {}
    for key in _body_keys(node):
        name = node.attrs[key]
        if name == "":
            continue
        try:
            check_guards(graph.subgraphs[name], bindings)
        except ShapeBindingError as exc:
            failed[key] = exc
    return failed


def _scaled_symbol(want: SymDim) -> tuple[str, int] | None:
    """(symbol, factor) when `want` is factor * symbol with factor >= 2 (from_onnx's (name, min, max, multiple))."""
    symbols = free_symbols(want)
    if len(symbols) != 1:
        return None
    (text,) = symbols
    factor = substitute(want, {text: 1})
    if isinstance(factor, int) and factor >= 2 and want == sym(text) * factor:
        return text, factor
    return None


def _describe(bindings: Mapping[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(bindings.items()))


def specialize(graph: Graph, bindings: Mapping[str, int]) -> Graph:
    """The static graph for `bindings`: every symbolic dimension of specs and attributes evaluated."""
    out = graph.copy()
    out.symbols = {}
    out.specs = {name: _concrete_spec(spec, bindings) for name, spec in graph.specs.items()}
    out.nodes = [Node(n.op, list(n.inputs), list(n.outputs), _concrete_attrs(n.attrs, bindings), dict(n.meta),
                      n.name) for n in graph.nodes]
    left_out = set()
    for node in out.nodes:  # a cond branch whose guards fail here cannot run at these sizes: left out
        if node.op == "cond":
            for key, exc in _failed_bodies(node, graph, bindings).items():
                left_out.add(node.attrs[key])
                node.attrs[key] = ""
                node.attrs["unreachable"] = str(exc)[:500]
    out.subgraphs = {k: specialize(body, bindings) for k, body in graph.subgraphs.items()  # control-flow bodies
                     if k not in left_out}
    return out


def _concrete_spec(spec: TensorSpec, bindings: Mapping[str, int]) -> TensorSpec:
    if spec.is_static:
        return spec
    return TensorSpec(tuple(evaluate(d, bindings) for d in spec.shape), spec.dtype)


def _concrete_attrs(value: Any, bindings: Mapping[str, int]) -> Any:
    if isinstance(value, SymDim):
        return evaluate(value, bindings)
    if isinstance(value, dict):
        return {k: _concrete_attrs(v, bindings) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_concrete_attrs(v, bindings) for v in value)
    return value


# -- value-deciding inputs ---------------------------------------------------------------------------------
# Some inputs decide a program's structure by their contents, not their shape: reduction axes, a Resize's
# scales, a Reshape's target (ONNX feeds them as graph inputs). A template specialises on their values as it
# does on symbol bindings (runtime/specializing.py): the values are folded in at first call and the result is
# cached under them. Only small inputs qualify: the key holds their bytes, and a large tensor deciding the
# structure is almost always a model that computes a shape from data, which no cache would serve.
MAX_VALUE_ELEMENTS = 64

ValueKey = tuple[tuple[str, str, tuple[int, ...], bytes], ...]  # (input, dtype, shape, bytes) per value input


class ValueBindingError(EdgerunError):
    """A value-deciding input that cannot be specialised on: missing from a call, or too large. The message
    names the input."""


def value_key(names: Sequence[str], values: Mapping[str, Any]) -> ValueKey:
    """The cache key of a call's value-deciding inputs: each one's dtype, shape and bytes, checked small.

    Two calls share a specialisation only when every value-deciding input is equal element for element (and
    in dtype and shape), so a call with other axes never reuses one made for different axes."""
    key = []
    for name in names:
        if name not in values:
            raise ValueBindingError(f"input {name!r} decides the program's structure by its value and must be "
                                    "given on every call")
        array = np.ascontiguousarray(values[name])
        check_value_size(name, array.shape)
        key.append((name, array.dtype.str, tuple(array.shape), array.tobytes()))
    return tuple(key)


def check_value_size(name: str, shape: Sequence[Any], why: str = "") -> None:
    """Refuse a value-deciding input of more than MAX_VALUE_ELEMENTS elements (or of unbounded size)."""
    size = 1
    for d in shape:
        if not isinstance(d, int):
            size = -1
            break
        size *= d
    if size < 0 or size > MAX_VALUE_ELEMENTS:
        shown = "x".join(str(d) for d in shape) or "scalar"
        raise ValueBindingError(
            f"input {name!r} (shape {shown}) decides the program's structure by its value{why}, but only inputs "
            f"of at most {MAX_VALUE_ELEMENTS} elements can: the program would be specialised per distinct "
            "value. Freeze it with constant_inputs= if it is fixed, or compute the value from static shapes")
