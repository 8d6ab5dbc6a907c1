"""Which shared constants ONNX Runtime no longer reads once a session is built.

Some ORT kernels prepack a constant input into a layout of their own while the session is created: MatMulNBits
packs its 4-bit codes for MLAS, whose kernels then read only the packed copy, and the float MatMul packs a
constant right-hand side for MLAS's SGEMM. The program's array of such a constant is never read again by that
session, so a compiled partition can say so
(`CompiledPartition.released_constants`) and the runtime can drop the host's copy once no other partition
or method reads it (runtime/constant_release.py). For SmolLM2 that is the layers' 4-bit codes, about 50 MB
of the 111 MB of constants.

Whether a kernel prepacks depends on the machine (MLAS has a packed kernel for this CPU, block size and
accuracy level, or not) and on ORT's version, so it is measured, not assumed: a one-node probe session
shares a constant the way `make_session` does, runs, then has the constant's bytes changed and runs again.
Equal outputs mean the session never reads the array after it is built. One probe per kernel signature,
cached for the process; a probe that fails for any reason releases nothing.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# (op type, domain) -> the input slots whose constant the probe checks; other inputs are never released.
# MatMulNBits' scales too: at accuracy level 4 MLAS folds them into its int8 layout (SmolLM2: 13 MB more
# released); at level 0 it reads them on every call, and the probe says so.
PREPACKED_INPUTS = {("MatMulNBits", "com.microsoft"): (1, 2), ("MatMul", ""): (1,)}

# A float MatMul's constant right-hand side of at most this many rows (its contraction length) and at least
# this size is read in place instead, as an input bound to the program's array (`read_in_place`).
IN_PLACE_MAX_ROWS = 64
IN_PLACE_MIN_BYTES = 32 * 1024


@dataclass
class HandedOver:
    """What a session was given beside its model: kept here, not on ORT's object, for as long as it lives."""

    values: dict[str, Any]  # the OrtValues over the program's arrays: they must outlive the session
    shared: set[str]  # the initializers ORT uses in place (the program's bytes), not copied in


_HANDED_OVER: weakref.WeakKeyDictionary[Any, HandedOver] = weakref.WeakKeyDictionary()


def hand_over(session: Any, values: dict[str, Any], shared: set[str]) -> None:
    """Record what make_session gave `session` beside its model, for as long as the session lives."""
    _HANDED_OVER[session] = HandedOver(values, shared)


def shared_initializers(session: Any) -> set[str]:
    """The initializers `session` reads in place from the program's arrays (make_session's sessions)."""
    return _HANDED_OVER[session].shared


def release_initializer(session: Any, name: str) -> None:
    """Drop this module's OrtValue of `name` (ORT holds its own packed copy, or the probe needs it gone)."""
    _HANDED_OVER[session].values.pop(name, None)


def input_slots(model: Any, names: set[str]) -> dict[str, list[tuple[Any, int]]]:
    """name -> every (node, input index) of `model`'s graph that reads it, for the names in `names`."""
    slots: dict[str, list[tuple[Any, int]]] = {}
    for node in model.graph.node:
        for k, name in enumerate(node.input):
            if name in names:
                slots.setdefault(name, []).append((node, k))
    return slots


def read_in_place(model: Any, external: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The shared constants `model` should read from the program's arrays at run time rather than have each
    session prepack: a float MatMul's right-hand side with few rows (such as [18 or 48, N]). A prepacked copy
    per session costs its size in every method's session (13 MB a session for SmolLM2-sized ones)
    and buys little: MLAS multiplies one row by an unpacked B directly, and for more rows packs B per call,
    a pass over B that is 1/M of the multiply's work. The two kernels round differently, so a row's result
    then depends on how many rows run with it (which is why the LLM's Q4_1 offset term is not of this form:
    a batched decode's row must equal the single decode's, docs/llm.md). Larger contraction lengths (a
    transformer's weights) stay initializers: ORT's fusions and packing matter there. Moves the chosen ones
    from the model's initializers to its inputs (the caller binds them) and returns them."""
    from onnx import TensorProto, helper

    uses = input_slots(model, set(external))
    outputs = {o.name for o in model.graph.output}
    chosen = {name: external[name] for name, readers in uses.items()
              if _few_rows(external[name]) and name not in outputs
              and all((n.op_type, n.domain, k) == ("MatMul", "", 1) for n, k in readers)}
    if chosen:
        kept = [t for t in model.graph.initializer if t.name not in chosen]
        del model.graph.initializer[:]
        model.graph.initializer.extend(kept)
        model.graph.input.extend(helper.make_tensor_value_info(name, TensorProto.FLOAT, list(value.shape))
                                 for name, value in chosen.items())
    return chosen


def _few_rows(value: np.ndarray) -> bool:
    return value.dtype == np.float32 and value.ndim == 2 and value.shape[0] <= IN_PLACE_MAX_ROWS \
        and value.nbytes >= IN_PLACE_MIN_BYTES and value.flags.c_contiguous

# (model, {name: array}) -> a session using those arrays as make_session does (the maker adds their
# placeholders to the model)
SessionMaker = Callable[[Any, dict[str, np.ndarray]], Any]


def released_initializers(model: Any, shared: set[str], make: SessionMaker) -> set[str]:
    """The shared initializers of `model` that its session does not read after it is built: each one read
    only at a prepacked input slot of nodes whose kernel signature the probe found prepacked."""
    slots = input_slots(model, shared)
    graph_outputs = {o.name for o in model.graph.output}
    dtypes = {t.name: t.data_type for t in model.graph.initializer}
    dims = {t.name: tuple(int(d) for d in t.dims) for t in model.graph.initializer}
    released = set()
    for name, uses in slots.items():
        if name in graph_outputs:
            continue
        if all(k in PREPACKED_INPUTS.get((n.op_type, n.domain), ()) and _probe((*_signature(n, dtypes, dims), k), make)
               for n, k in uses):
            released.add(name)
    return released


def _signature(node: Any, dtypes: dict[str, int], dims: dict[str, tuple[int, ...]]) -> tuple[Any, ...]:
    """What decides whether the node's kernel prepacks (the probe adds the input slot). MatMulNBits: bits,
    block size, accuracy level, its inputs present and its zero points' type (float zero points turn
    prepacking off). MatMul: the constant's type and shape (MLAS packs a float 2-D right-hand side; the probe
    uses the real shape)."""
    if node.op_type == "MatMul":
        return (node.op_type, node.domain, dtypes.get(node.input[1], -1), dims.get(node.input[1], ()))
    attrs = {a.name: a.i for a in node.attribute if a.name in ("bits", "block_size", "accuracy_level")}
    present = tuple(bool(i) for i in node.input)
    zero_points = dtypes.get(node.input[3], -1) if len(node.input) > 3 and node.input[3] else None
    return (node.op_type, node.domain, attrs.get("bits", 4), attrs.get("block_size", 32),
            attrs.get("accuracy_level", 0), present, zero_points)


@functools.cache
def _probe_cached(signature: tuple[Any, ...], make: SessionMaker) -> bool:
    try:
        return _PROBES[signature[0]](signature, make)
    except Exception:  # an ORT that refuses the probe: keep every array
        return False


def _probe(signature: tuple[Any, ...], make: SessionMaker) -> bool:
    return signature[0] in _PROBES and _probe_cached(signature, make)


def _probe_matmul_nbits(signature: tuple[Any, ...], make: SessionMaker) -> bool:
    from onnx import TensorProto, helper, numpy_helper

    _, domain, bits, block, level, present, zero_points, slot = signature
    if bits != 4 or len(present) > 4 or any(present[4:]) or zero_points not in (None, TensorProto.UINT8):
        return False
    k, n = 2 * block, 16
    blocks = k // block
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8)
    scales = rng.random(n * blocks, dtype=np.float32) + 0.5
    # The probed input is shared (the session's OrtValue over our array); the other is an initializer.
    probed, value, change = ("codes", codes, lambda c: 255 - c) if slot == 1 else ("scales", scales, lambda s: 2 * s)
    inits = [numpy_helper.from_array(other, name) for name, other in (("codes", codes), ("scales", scales))
             if name != probed]
    ins = ["a", "codes", "scales"]
    if len(present) > 3 and present[3]:
        inits.append(numpy_helper.from_array(np.full(n * ((blocks + 1) // 2), 0x88, np.uint8), "zero_points"))
        ins.append("zero_points")
    attrs = {"K": k, "N": n, "bits": bits, "block_size": block, **({"accuracy_level": level} if level else {})}
    node = helper.make_node("MatMulNBits", ins, ["y"], domain=domain, **attrs)
    graph = helper.make_graph([node], "prepack_probe", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(domain, 1)])
    model.ir_version = 9
    a = rng.standard_normal((1, k)).astype(np.float32)
    return _reads_once(model, probed, value, change, a, make)


def _probe_matmul(signature: tuple[Any, ...], make: SessionMaker) -> bool:
    from onnx import TensorProto, helper

    _, domain, dtype, shape, _slot = signature
    if dtype != TensorProto.FLOAT or len(shape) != 2 or 0 in shape:
        return False
    k, n = shape
    node = helper.make_node("MatMul", ["a", "b"], ["y"], domain=domain)
    graph = helper.make_graph([node], "prepack_probe", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, n])], [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 9
    rng = np.random.default_rng(0)
    return _reads_once(model, "b", rng.random((k, n), dtype=np.float32) + 0.5, lambda b: -b,
                       rng.random((2, k), dtype=np.float32) + 0.5, make)


def _reads_once(model: Any, name: str, value: np.ndarray, change: Callable[[np.ndarray], np.ndarray],
                a: np.ndarray, make: SessionMaker) -> bool:
    """Whether a session sharing `value` as `name` answers the same after the array's bytes are changed."""
    shared = value.copy()
    session = make(model, {name: shared})
    if name not in shared_initializers(session):  # ORT copied it in: the probe would prove nothing
        return False
    release_initializer(session, name)  # as compile does for a released constant: ORT keeps no OrtValue of ours
    before = session.run(None, {"a": a})[0]
    shared[...] = change(shared)  # a session reading the array would now answer differently
    after = session.run(None, {"a": a})[0]
    return bool(np.array_equal(before, after)) and bool(np.abs(before).sum() > 0)


_PROBES: dict[str, Callable[[tuple[Any, ...], SessionMaker], bool]] = {
    "MatMulNBits": _probe_matmul_nbits, "MatMul": _probe_matmul}
