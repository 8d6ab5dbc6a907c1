"""One ONNX Runtime session for partitions that are the same graph at different sizes.

An LLM's `prefill` (T = 128 tokens) and `decode` (T = 1) methods compile to ONNX graphs that match node for
node: the same kernels over the same weight arrays, differing only in their input sizes and in small integer
constants (reshape targets such as [T, 18, 16, 1], the cache write's last start C - T). Each session prepacks
its own copy of the weights (ONNX Runtime shares no prepacked weights between sessions from Python), so two
sessions hold two copies: 90-120 MB for SmolLM2. Here such partitions are found and given one session over a
*generic* model, built from the newest variant:

- every input and output dimension that differs between the variants becomes symbolic;
- a differing reshape target that differs in one entry only, with no -1, gets -1 there (Reshape infers it);
- any other differing integer constant is chosen at run time from the variants' values by a selector: an
  input dimension that tells the variants apart (`Where(dim == T_1, c_1, Where(dim == T_2, c_2, ...))`).

The generic model computes exactly each variant's graph at that variant's sizes (the only sizes its partition
is ever run at), and nothing else is assumed: variants must agree on every node, attribute, float constant
and weight array (the very same memory, or equal contents for small arrays the builder made), and on the
session's settings. Anything else is a different form and gets a session of its own.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# Integer initializers up to this many elements are the constants variants may differ in (shapes, starts).
PARAM_MAX_ELEMENTS = 64
# Weight arrays the builder made (copies, not views of the program's arrays) are compared by content up to
# this size; larger ones must be the same memory.
CONTENT_COMPARE_BYTES = 1 << 22


def _root(array: np.ndarray) -> Any:
    """The object that owns `array`'s memory (the end of its `.base` chain)."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array.base if array.base is not None else array


def _weak(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:  # an owner that takes no weak references is never taken as proof of identity
        return None


@dataclass(frozen=True)
class _ArrayRef:
    """What identifies a weight array without keeping it alive: its owner (weakly), where it lies in the
    owner's memory, and its layout. A freed owner matches nothing, so reused addresses are never mistaken."""

    array: Any  # weakref to the array object, or None
    root: Any  # weakref to its memory's owner, or None
    address: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @staticmethod
    def of(array: np.ndarray) -> _ArrayRef:
        return _ArrayRef(_weak(array), _weak(_root(array)), int(array.ctypes.data), array.dtype.str,
                         tuple(array.shape), tuple(array.strides))

    def same_memory(self, other: np.ndarray) -> bool:
        """`other` is this very array, or a view of the same bytes of the same live owner."""
        if (self.dtype, self.shape) != (other.dtype.str, tuple(other.shape)):
            return False
        if self.array is not None and self.array() is other:
            return True
        root = self.root() if self.root is not None else None
        return root is not None and root is _root(other) and self.address == int(other.ctypes.data) \
            and self.strides == tuple(other.strides)

    def same_content(self, other: np.ndarray) -> bool:
        """`other` equals this array, which is still alive and small enough to compare."""
        mine = self.array() if self.array is not None else None
        return mine is not None and (self.dtype, self.shape) == (other.dtype.str, tuple(other.shape)) \
            and other.nbytes <= CONTENT_COMPARE_BYTES and bool(np.array_equal(mine, other))


@dataclass
class Variant:
    """One compiled partition's ONNX graph, split into what variants must share (`form`) and what may differ
    (`params`: the integer constants per node input slot; `dims`: input and output shapes)."""

    form: tuple[Any, ...]
    params: dict[tuple[int, int], np.ndarray]
    dims: tuple[tuple[int, ...], ...]
    arrays: list[_ArrayRef]  # the weight arrays in the order `form` meets them
    array_names: list[str]  # their names in this variant's model
    member: Any = None  # weakref to whatever uses the session (the backend's runner)
    spin: bool = False  # whether its session's pool threads spin (variants may differ; a shared one spins if any)

    def alive(self) -> bool:
        member = self.member() if self.member is not None else None
        return member is not None and not getattr(member, "closed", False)


def describe(model: Any, arrays: Mapping[str, np.ndarray], settings: tuple[Any, ...],
             spin: bool = False) -> tuple[Variant, list[np.ndarray]]:
    """`model` (whose weights are `arrays`, by initializer or input name) as a Variant, and its weight arrays
    in the Variant's order. `settings` (threads, ...) are part of the form: a session has one. `spin` is not:
    a session shared by variants tuned differently spins."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    canon: dict[str, Any] = {}
    found: list[np.ndarray] = []
    names: list[str] = []
    dims = tuple(tuple(d.dim_value for d in v.type.tensor_type.shape.dim) for v in [*graph.input, *graph.output])
    for k, value in enumerate(graph.input):
        if value.name in arrays:
            canon[value.name] = ("w", len(found))
            found.append(arrays[value.name])
            names.append(value.name)
        else:
            canon[value.name] = ("in", k, value.type.tensor_type.elem_type, len(value.type.tensor_type.shape.dim))
    params: dict[tuple[int, int], np.ndarray] = {}
    nodes = []
    for j, node in enumerate(graph.node):
        ins: list[Any] = []
        for s, name in enumerate(node.input):
            if not name:
                ins.append("")
            elif name in canon:
                ins.append(canon[name])
            elif name in arrays:
                canon[name] = ("w", len(found))
                found.append(arrays[name])
                names.append(name)
                ins.append(canon[name])
            elif name in inits:
                tensor = inits[name]
                if tensor.data_location == TensorProto.EXTERNAL:
                    ins.append(("missing", name))  # a placeholder without its array: never matches another
                    continue
                value = numpy_helper.to_array(tensor)
                if value.dtype.kind in "iu" and value.size <= PARAM_MAX_ELEMENTS:
                    params[(j, s)] = value
                    ins.append(("p", value.dtype.str, value.shape))
                else:
                    ins.append(("c", value.dtype.str, value.shape, value.tobytes()))
            else:
                ins.append(("outer", name))  # read from an enclosing scope: compared by name
        for o, name in enumerate(node.output):
            canon[name] = ("n", j, o)
        attrs = tuple((a.name, str(helper.get_attribute_value(a))) for a in node.attribute)
        nodes.append((node.op_type, node.domain, tuple(ins), attrs, len(node.output)))
    outputs = tuple((canon.get(v.name, ("?", v.name)), v.type.tensor_type.elem_type) for v in graph.output)
    form = (tuple(settings), tuple(nodes), outputs, len(graph.input))
    return Variant(form, params, dims, [_ArrayRef.of(a) for a in found], names, spin=spin), found


def matches(variant: Variant, other: Variant, other_arrays: Sequence[np.ndarray]) -> bool:
    """Whether two partitions can share a session: the same form over the same weight arrays, and sizes or
    constants that tell them apart (two variants at the same sizes with different constants cannot be
    selected between at run time)."""
    if variant.form != other.form or len(variant.arrays) != len(other_arrays):
        return False
    # At least one weight must be the very same memory (the arrays of one program): equal small weights of
    # unrelated programs (tests built from one seed) would otherwise pull their sessions into one generic
    # session, slowing each program's first call behind symbolic sizes for no memory gained. The rest may
    # be equal copies the emitter made (RoPE table halves).
    same = [ref.same_memory(a) for ref, a in zip(variant.arrays, other_arrays)]
    if not any(same) or not all(s or ref.same_content(a) for s, ref, a in zip(same, variant.arrays, other_arrays)):
        return False
    return variant.dims != other.dims or all(np.array_equal(v, other.params[k]) for k, v in variant.params.items())


def generic_model(model: Any, variants: Sequence[Variant]) -> Any | None:
    """`model` (the last variant's graph) made to compute every variant's graph at its sizes; None when no
    input dimension tells the variants apart (then they are one size, and equal, so no model is needed)."""
    from onnx import helper, numpy_helper

    n_in = len(model.graph.input)
    shapes = [v.dims for v in variants]
    selector = next(((p, a) for p in range(n_in) for a in range(len(shapes[0][p]))
                     if len({s[p][a] for s in shapes}) == len(shapes)), None)
    if selector is None:
        return None
    generic = type(model)()
    generic.CopyFrom(model)
    graph = generic.graph
    del graph.value_info[:]
    for k, value in enumerate([*graph.input, *graph.output]):
        for a, dim in enumerate(value.type.tensor_type.shape.dim):
            if len({s[k][a] for s in shapes}) > 1:
                dim.Clear()
                dim.dim_param = f"edgerun_dim_{k}_{a}"
    new_nodes: list[Any] = []
    made: dict[tuple[bytes, ...], str] = {}
    selects: list[str] = []

    def selected(p: int, a: int) -> list[str]:
        if not selects:  # Equal(input p's dim a, that variant's size) per variant but the last
            dim = f"edgerun_variant_dim_{p}_{a}"
            new_nodes.append(helper.make_node("Shape", [graph.input[p].name], [dim + "_1"], start=a, end=a + 1))
            new_nodes.append(helper.make_node("Squeeze", [dim + "_1"], [dim]))
            for k, v in enumerate(variants[:-1]):
                size = numpy_helper.from_array(np.asarray(v.dims[p][a], np.int64), f"{dim}_is_{k}_size")
                graph.initializer.append(size)
                selects.append(f"{dim}_is_{k}")
                new_nodes.append(helper.make_node("Equal", [dim, size.name], [selects[-1]]))
        return selects

    for (j, s), last_value in sorted(variants[-1].params.items()):
        values = [v.params[(j, s)] for v in variants]
        if all(np.array_equal(values[0], x) for x in values[1:]):
            continue
        node = graph.node[j]
        key = (*(x.tobytes() for x in values), last_value.dtype.str.encode())
        if key not in made:
            differing = {i for x in values[1:] for i in np.flatnonzero(x != values[0])}
            if node.op_type == "Reshape" and s == 1 and len(differing) == 1 and not any((x == -1).any() for x in values):
                target = last_value.copy()
                target[differing.pop()] = -1
                name = f"edgerun_generic_{len(made)}"
                graph.initializer.append(numpy_helper.from_array(target, name))
            else:
                sel = selected(*selector)
                name = f"edgerun_generic_{len(made)}_last"
                graph.initializer.append(numpy_helper.from_array(values[-1], name))
                for k in reversed(range(len(variants) - 1)):
                    const = numpy_helper.from_array(values[k], f"edgerun_generic_{len(made)}_{k}")
                    graph.initializer.append(const)
                    out = f"edgerun_generic_{len(made)}_upto_{k}"
                    new_nodes.append(helper.make_node("Where", [sel[k], const.name, name], [out]))
                    name = out
            made[key] = name
        node.input[s] = made[key]
    if new_nodes:
        kept = list(graph.node)
        del graph.node[:]
        graph.node.extend([*new_nodes, *kept])
    return generic


class ShapeVariants:
    """A backend's groups of live variants, one group per shared session.

    Only sessions this process built are shared: a forked child (a fleet agent, a stream worker) inherits
    the parent's sessions without their thread pools, so a run on one would wait forever for threads that
    are not there. The child forgets them and builds its own."""

    def __init__(self) -> None:
        self.groups: list[list[Variant]] = []
        self.pid = os.getpid()

    def find(self, variant: Variant, arrays: Sequence[np.ndarray]) -> list[Variant] | None:
        """The group `variant` can join (its live members only), or None. Called before every `add`."""
        if self.pid != os.getpid():
            self.groups, self.pid = [], os.getpid()
        for group in self.groups:
            group[:] = [v for v in group if v.alive()]
        self.groups = [g for g in self.groups if g]
        matching = [g for g in self.groups if matches(g[0], variant, arrays)]
        # A group spinning as this variant does first: the search's trial of a spin change loads every length
        # again with the other setting, and those should share a session with each other.
        return next((g for g in matching if all(v.spin == variant.spin for v in g)), next(iter(matching), None))

    def add(self, variant: Variant) -> None:
        self.groups.append([variant])
