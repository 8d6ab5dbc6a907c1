"""The op registry: every op the IR knows, with its kind, shape rule and (for composites) decomposition.

Three kinds (ARCHITECTURE.md):
- ATOMIC: each backend implements it as a kernel.
- RASTER: the single data-movement op (regions of offset + 3 strides in and out).
- COMPOSITE: written once as a decomposition into atomic ops and raster; no backend needs a kernel.
- CONTROL_FLOW: cond, while_loop, scan: nodes that run subgraphs (ops/control_flow_ops.py); a backend takes
  one whole (Backend.control_flow) or not at all.
- DATA_DEPENDENT: nonzero, unique, top_k_dynamic, non_max_suppression: an output extent known only once the node has run, a
  fresh symbol bound at run time (ops/data_dependent_ops.py); the program is run in stages split at such
  nodes (ir/staging.py), and the node itself runs on the reference kernel between them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.ir.symbolic import SymbolicShapeError
from edgerun.ir.tensor_spec import TensorSpec

if TYPE_CHECKING:
    from edgerun.ir.builder import Builder
    from edgerun.ir.graph import Graph, Node


class OpKind(StrEnum):
    ATOMIC = "atomic"
    RASTER = "raster"
    COMPOSITE = "composite"
    CONTROL_FLOW = "control_flow"
    DATA_DEPENDENT = "data_dependent"


ShapeRule = Callable[[list[TensorSpec], dict[str, Any]], list[TensorSpec]]
Decomposition = Callable[["Builder", list[str], dict[str, Any]], list[str]]
# The shape rule of a control-flow op also sees its bodies (in the order of OpDef.bodies).
BodyShapeRule = Callable[[list[TensorSpec], dict[str, Any], Sequence["Graph | None"]], list[TensorSpec]]


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: OpKind
    infer: ShapeRule
    # Inputs: `min_inputs` required, up to `max_inputs` (None: variadic). An omitted optional input is "".
    min_inputs: int
    max_inputs: int | None
    decompose: Decomposition | None = None
    doc: str = ""
    # The family a backend can implement with one table-driven kernel (e.g. "unary", "binary").
    family: str = ""
    # Control flow: the attrs naming the node's bodies (subgraphs of the graph holding the node), and the
    # shape rule that reads them (then `infer` is never called).
    bodies: tuple[str, ...] = ()
    infer_with_bodies: BodyShapeRule | None = None


_REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in _REGISTRY:
        raise ValueError(f"op {op.name!r} registered twice")
    if op.kind is OpKind.COMPOSITE and op.decompose is None:
        raise ValueError(f"composite op {op.name!r} needs a decomposition")
    _REGISTRY[op.name] = op
    return op


def get_op(name: str) -> OpDef:
    _ensure_loaded()
    try:
        return _REGISTRY[name]
    except KeyError:
        raise UnsupportedOpError(name, detail="not in the edgerun op registry") from None


def has_op(name: str) -> bool:
    _ensure_loaded()
    return name in _REGISTRY


def all_ops(kind: OpKind | None = None) -> list[OpDef]:
    _ensure_loaded()
    return [op for op in _REGISTRY.values() if kind is None or op.kind is kind]


def infer_specs(op: str, inputs: list[TensorSpec], attrs: dict[str, Any],
                subgraphs: Mapping[str, Graph] | None = None) -> list[TensorSpec]:
    """Output specs of `op` applied to `inputs`; ValueError with a reason when they do not fit.

    `subgraphs`: the bodies a control-flow node may name (its graph's `subgraphs`).
    """
    d = get_op(op)
    n = len(inputs)
    if n < d.min_inputs or (d.max_inputs is not None and n > d.max_inputs):
        want = f"{d.min_inputs}" if d.max_inputs == d.min_inputs else f"{d.min_inputs}..{d.max_inputs or 'n'}"
        raise ValueError(f"{op} takes {want} inputs, got {n}")
    try:
        if d.infer_with_bodies is not None:
            bodies: list[Graph | None] = []
            for key in d.bodies:
                name = attrs.get(key)
                if name == "":  # no body: a branch that cannot run at these shapes (the op's rule says if allowed)
                    bodies.append(None)
                elif not isinstance(name, str) or name not in (subgraphs or {}):
                    raise ValueError(f"{op} attr {key!r} names subgraph {name!r}, which the graph does not have")
                else:
                    bodies.append((subgraphs or {})[name])
            return d.infer_with_bodies(inputs, attrs, bodies)
        return d.infer(inputs, attrs)
    except SymbolicShapeError as exc:  # a rule that needs a concrete size: say which op asked
        raise SymbolicShapeError(f"{op}: {exc}") from None


# ---- gradients ----------------------------------------------------------------------------------------
# Each op's vector-Jacobian product lives beside its definition (ir/ops/*.py), micrograd's habit. A rule gets
# a builder on the graph being differentiated, the forward node, one cotangent per output (None: zero) and
# which inputs need one, and returns one cotangent per input (None: zero, or not needed). It may read the
# node's inputs and outputs (the forward activations) and emits ordinary IR, so any backend runs backward.
# A composite without a rule of its own is differentiated through its decomposition.
GradientRule = Callable[["Builder", "Node", list["str | None"], list[bool]], list["str | None"]]

_GRADIENTS: dict[str, GradientRule] = {}
_NO_GRADIENT: dict[str, str] = {}  # op -> why it has none (integer, comparison, random, string ...)


class NoGradientError(EdgerunError):
    """Differentiation reached a node whose op has no gradient."""


def register_gradient(*names: str) -> Callable[[GradientRule], GradientRule]:
    """Decorator: the rule is the vector-Jacobian product of each op in `names`."""
    def deco(rule: GradientRule) -> GradientRule:
        for name in names:
            if name in _GRADIENTS or name in _NO_GRADIENT:
                raise ValueError(f"op {name!r} given a gradient twice")
            _GRADIENTS[name] = rule
        return rule
    return deco


def register_no_gradient(names: Sequence[str], reason: str) -> None:
    """Ops that have no gradient, and why (differentiating through one is a NoGradientError)."""
    for name in names:
        if name in _GRADIENTS or name in _NO_GRADIENT:
            raise ValueError(f"op {name!r} given a gradient twice")
        _NO_GRADIENT[name] = reason


def gradient_rule(name: str) -> GradientRule | None:
    """The op's own vector-Jacobian product; None when it has none (see no_gradient_reason)."""
    _ensure_loaded()
    return _GRADIENTS.get(name)


def no_gradient_reason(name: str) -> str | None:
    """Why op `name` has no gradient, or None when it has one (its own or its decomposition's)."""
    _ensure_loaded()
    if name in _GRADIENTS:
        return None
    if name in _NO_GRADIENT:
        return _NO_GRADIENT[name]
    op = _REGISTRY.get(name)
    if op is not None and op.kind is OpKind.COMPOSITE:
        return None
    return "no gradient rule is registered for it"


_loaded = False


def _ensure_loaded() -> None:
    # The op modules register themselves on import; importing them lazily avoids an import cycle with
    # builder.py, which the composite decompositions use.
    global _loaded
    if not _loaded:
        _loaded = True
        import edgerun.ir.ops  # noqa: F401
