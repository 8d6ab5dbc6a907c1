"""The IR verifier: every op registered, every value defined once before use, specs match the shape rules."""

from __future__ import annotations

from edgerun.errors import UnsupportedOpError, VerificationError
from edgerun.ir.builder import _ABSENT, fixed_spec
from edgerun.ir.graph import Graph, Node
from edgerun.ir.registry import get_op, infer_specs
from edgerun.ir.state import verify_state


def _where(node: Node) -> str:
    src = node.meta.get("module_path") or node.meta.get("source") or ""
    return f"node {node.name!r} ({node.op}{', from ' + src if src else ''})"


def verify(graph: Graph, *, allow_composite: bool = True) -> None:
    """Raise VerificationError on the first broken invariant."""
    # Bodies first: they are closed graphs, verified on their own, and their nodes' shape rules read them.
    for name, body in graph.subgraphs.items():  # bodies are closed graphs: verified on their own
        if body.state_inputs or body.state_updates:
            # State belongs to the method graph: it passes a state into a body as an operand and takes the
            # new value back as a result (what the torch frontend's functional bodies do).
            raise VerificationError(f"subgraph {name!r} reads or updates state "
                                    f"{sorted({*body.state_inputs, *body.state_updates})}: a control-flow body "
                                    "takes a state as an operand and returns its new value as a result")
        try:
            verify(body, allow_composite=allow_composite)
        except VerificationError as exc:
            raise VerificationError(f"subgraph {name!r}: {exc}") from None
    defined: set[str] = set()
    for name in graph.inputs:
        if name in defined:
            raise VerificationError(f"graph input {name!r} listed twice")
        if name in graph.constants:
            raise VerificationError(f"graph input {name!r} is also a constant")
        defined.add(name)
    for name, arr in graph.constants.items():
        spec = graph.specs.get(name)
        if spec is None or tuple(arr.shape) != spec.shape or arr.dtype != spec.dtype.np:
            raise VerificationError(f"constant {name!r} does not match its spec {spec}")
        defined.add(name)
    defined |= verify_state(graph)
    for name in defined:
        if name not in graph.specs:
            raise VerificationError(f"value {name!r} has no TensorSpec")
    for node in graph.nodes:
        try:
            opdef = get_op(node.op)
        except UnsupportedOpError as exc:
            raise VerificationError(f"{_where(node)}: {exc}") from None
        if opdef.kind.value == "composite" and not allow_composite:
            raise VerificationError(f"{_where(node)}: composite op left after decomposition")
        for i in node.inputs:
            if i and i not in defined:
                raise VerificationError(f"{_where(node)} reads {i!r} before it is defined (dangling or cycle)")
        try:
            want = infer_specs(node.op, [graph.specs[i] if i else _ABSENT for i in node.inputs], node.attrs,
                               graph.subgraphs)
        except (ValueError, KeyError, TypeError) as exc:
            raise VerificationError(f"{_where(node)}: {exc}") from None
        if len(want) != len(node.outputs):
            raise VerificationError(f"{_where(node)} has {len(node.outputs)} outputs, its op makes {len(want)}")
        for out, spec in zip(node.outputs, want):
            if out in defined:
                raise VerificationError(f"{_where(node)} redefines {out!r}")
            # A size the symbols' bounds fix is written as that number by the builder (builder.fixed_spec); a
            # program saved before it did keeps the symbolic form, equal at every size the bounds allow.
            if graph.specs.get(out) not in (spec, fixed_spec(spec, graph.symbols) if graph.symbols else spec):
                raise VerificationError(f"{_where(node)}: output {out!r} is {graph.specs.get(out)}, "
                                        f"its op makes {spec}")
            defined.add(out)
    for name in graph.outputs:
        if name not in defined:
            raise VerificationError(f"graph output {name!r} is never defined")
