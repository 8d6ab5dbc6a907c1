"""Control-flow ops: cond, while_loop and scan, each running closed subgraphs (ir/subgraphs.py).

Shapes stay static (or symbolic, never data-dependent): both branches of a cond give the same specs, a
while_loop's carried values keep theirs from one iteration to the next, and a scan's length is part of its
inputs' shapes. So every node's result has a spec known before it runs, the memory plan is exact, and the
verifier checks each body's signature against its node here, in the shape rules.

- cond(pred, *operands; then, else): run one branch on the operands. pred is a one-element bool. A branch
  that cannot run at the graph's shapes (ONNX models branch on shapes: silero-vad's 8 kHz branch at a 16 kHz
  chunk length) may be left out: its attr is "" and attr `unreachable` says why; taking it is a clear
  run-time error, as in ONNX Runtime, instead of a failed import.
- while_loop(*carried, *invariants; cond, body, num_carried): while cond(carried, invariants) holds,
  carried = body(carried, invariants); the results are the final carried values.
- scan(*carried, *sequences, *invariants; body, num_carried, num_sequences, length): for t in 0..length-1,
  (carried, ys) = body(carried, sequences[t], invariants); the results are the final carried values and
  each y stacked along a new leading axis of size `length`. LSTM/GRU/RNN, ONNX Scan, torch's scan and map.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.registry import OpDef, OpKind, register, register_no_gradient
from edgerun.ir.tensor_spec import TensorSpec

Attrs = dict[str, Any]


def _specs(body: Graph, names: Sequence[str]) -> list[TensorSpec]:
    return [body.specs[n] for n in names]


def _describe(specs: Sequence[TensorSpec]) -> str:
    return "(" + ", ".join(str(s) for s in specs) + ")"


def _check_inputs(what: str, body: Graph, want: Sequence[TensorSpec]) -> None:
    got = _specs(body, body.inputs)
    if got != list(want):
        raise ValueError(f"{what} takes {_describe(got)}, the node passes {_describe(want)}")


def _check_predicate(what: str, spec: TensorSpec) -> None:
    if spec.dtype is not DType.bool or spec.numel != 1:
        raise ValueError(f"{what} must be a one-element bool, got {spec}")


def _count(attrs: Attrs, key: str, low: int, high: int) -> int:
    n = attrs.get(key)
    if type(n) is not int or not low <= n <= high:
        raise ValueError(f"attr {key} must be an integer in [{low}, {high}], got {n!r}")
    return n


def _all_present(op: str, bodies: Sequence[Graph | None]) -> list[Graph]:
    if any(b is None for b in bodies):
        raise ValueError(f"{op} needs every body (only a cond branch may be left out)")
    return [b for b in bodies if b is not None]


def _needs_bodies(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    raise ValueError("a control-flow op's shape rule needs its graph's subgraphs")


# ---- cond --------------------------------------------------------------------------------------------------

def _cond_rule(ins: list[TensorSpec], attrs: Attrs, bodies: Sequence[Graph | None]) -> list[TensorSpec]:
    _check_predicate("cond predicate", ins[0])
    present = [(side, body) for side, body in zip(("then", "else"), bodies) if body is not None]
    if not present:
        raise ValueError("cond needs at least one branch")
    if len(present) < 2 and not isinstance(attrs.get("unreachable"), str):
        raise ValueError("cond leaves out a branch without saying why (attr unreachable)")
    for side, body in present:
        _check_inputs(f"cond {side} branch", body, ins[1:])
    outs = _specs(present[0][1], present[0][1].outputs)
    for _side, body in present[1:]:
        if _specs(body, body.outputs) != outs:
            raise ValueError(f"cond branches give {_describe(outs)} and {_describe(_specs(body, body.outputs))}")
    return outs


register(OpDef("cond", OpKind.CONTROL_FLOW, _needs_bodies, 1, None, bodies=("then", "else"),
               infer_with_bodies=_cond_rule,
               doc="run subgraph `then` or `else` on the operands by a run-time bool; data-dependent branches "
                   "(torch.cond, ONNX If)"))


# ---- while_loop --------------------------------------------------------------------------------------------

def _while_rule(ins: list[TensorSpec], attrs: Attrs, bodies: Sequence[Graph | None]) -> list[TensorSpec]:
    cond, body = _all_present("while_loop", bodies)
    k = _count(attrs, "num_carried", 0, len(ins))
    carried = ins[:k]
    _check_inputs("while_loop cond", cond, ins)
    _check_inputs("while_loop body", body, ins)
    if len(cond.outputs) != 1:
        raise ValueError(f"while_loop cond gives {len(cond.outputs)} values, not one bool")
    _check_predicate("while_loop cond's result", cond.specs[cond.outputs[0]])
    if _specs(body, body.outputs) != carried:
        raise ValueError(f"while_loop body gives {_describe(_specs(body, body.outputs))}, the carried values are "
                         f"{_describe(carried)} (carried shapes are fixed)")
    return list(carried)


register(OpDef("while_loop", OpKind.CONTROL_FLOW, _needs_bodies, 0, None, bodies=("cond", "body"),
               infer_with_bodies=_while_rule,
               doc="repeat subgraph `body` on the carried values while subgraph `cond` holds; run-time trip "
                   "counts (torch.while_loop, ONNX Loop)"))


# ---- scan --------------------------------------------------------------------------------------------------

def _scan_rule(ins: list[TensorSpec], attrs: Attrs, bodies: Sequence[Graph | None]) -> list[TensorSpec]:
    (body,) = _all_present("scan", bodies)
    k = _count(attrs, "num_carried", 0, len(ins))
    m = _count(attrs, "num_sequences", 0, len(ins) - k)
    length = attrs.get("length")
    # A positive int, or a symbolic dimension (which has no bool's or float's type).
    if (type(length) is int and length < 1) or isinstance(length, (bool, float, str, list, dict, type(None))):
        raise ValueError(f"scan attr length must be a positive size, got {length!r}")
    carried, sequences, invariants = ins[:k], ins[k:k + m], ins[k + m:]
    for j, s in enumerate(sequences):
        if s.rank < 1 or s.shape[0] != length:
            raise ValueError(f"scan sequence {j} is {s}; its leading axis must be the length {length}")
    _check_inputs("scan body", body, [*carried, *(TensorSpec(s.shape[1:], s.dtype) for s in sequences),
                                      *invariants])
    outs = _specs(body, body.outputs)
    if outs[:k] != list(carried):
        raise ValueError(f"scan body gives carried values {_describe(outs[:k])}, the node carries "
                         f"{_describe(carried)} (carried shapes are fixed)")
    return [*carried, *(TensorSpec((length, *y.shape), y.dtype) for y in outs[k:])]


register(OpDef("scan", OpKind.CONTROL_FLOW, _needs_bodies, 0, None, bodies=("body",), infer_with_bodies=_scan_rule,
               doc="run subgraph `body` once per step of the leading axis of the sequences, carrying state and "
                   "stacking per-step results; recurrent layers (LSTM/GRU/RNN, ONNX Scan, torch scan/map)"))
register_no_gradient(["cond", "while_loop", "scan"],
                     "control flow: differentiating through a body is not supported; unroll it or keep it out of the trained part")
