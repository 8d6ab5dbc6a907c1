"""What an op handler sees while importing one ONNX node: its attributes, inputs, and the graph being built.

An ONNX value is known either as an IR value (a name in the graph) or as a constant numpy array. Constants
stay numpy until a handler needs them as graph values, so shape-computing chains (Shape -> Gather -> Concat
-> Reshape) fold at import time and their results can become static attributes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError, UnsupportedOpError
from edgerun.ir.builder import Builder
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph
from edgerun.ir.symbolic import Dim, SymDim

# ONNX TensorProto data types we hold; the rest are refused (see docs/onnx.md). The narrow ones (16-23, 25-26)
# are ml_dtypes dtypes (ir/dtypes.py); string (8) is an object array of str (strings.py). Not held:
# complex64/128 (14-15), which no op computes on.
ONNX_TO_DTYPE: dict[int, DType] = {1: DType.float32, 10: DType.float16, 11: DType.float64, 3: DType.int8,
                                   2: DType.uint8, 5: DType.int16, 4: DType.uint16, 6: DType.int32,
                                   12: DType.uint32, 7: DType.int64, 13: DType.uint64, 9: DType.bool,
                                   16: DType.bfloat16, 17: DType.float8_e4m3fn, 18: DType.float8_e4m3fnuz,
                                   19: DType.float8_e5m2, 20: DType.float8_e5m2fnuz, 21: DType.uint4,
                                   22: DType.int4, 23: DType.float4_e2m1fn, 24: DType.float8_e8m0fnu,
                                   25: DType.uint2, 26: DType.int2, 8: DType.string}
DTYPE_TO_ONNX: dict[DType, int] = {v: k for k, v in ONNX_TO_DTYPE.items()}


def is_string_constant(arr: np.ndarray) -> bool:
    """An object array of str (a string tensor), not one of symbolic sizes (symfold.py; never empty)."""
    return arr.dtype == object and all(type(e) is str for e in arr.reshape(-1))


class OnnxModelError(EdgerunError):
    """The ONNX file or model is malformed: unreadable protobuf, dangling value, cycle, bad type or opset."""


class ShapeBoundsError(UnsupportedOpError):
    """A handler that holds at some shapes within the symbols' bounds but not at all of them (or edgerun cannot
    prove it holds at all): narrower bounds or a pinned dimension import it. An If branch that raises it is
    left out, like a branch whose static shapes do not work out."""


class OnnxImportError(EdgerunError):
    """A handler produced something inconsistent with ONNX's own inference: a bug, never a silent answer."""


class DynamicInputError(UnsupportedOpError):
    """A handler needs an input's value at import time (a shape, axes, pads) but it is computed at run time.

    `value_name` is the ONNX value; when it is a graph input, `from_onnx(..., constant_inputs=)` can freeze it.
    """

    def __init__(self, op: str, value_name: str, *, source: str | None = None, detail: str | None = None) -> None:
        super().__init__(op, source=source, detail=detail)
        self.value_name = value_name
        # Filled in by the importer on the way out (import_onnx_graph): the graph inputs the value is computed
        # from, every input's spec, and the symbols declared, for a value template (value_template.py).
        self.graph_inputs: tuple[str, ...] = ()
        self.input_specs: dict[str, Any] = {}
        self.symbols: dict[str, tuple[int, int]] = {}


def onnx_dtype(code: int, what: str) -> DType:
    """Our DType for an ONNX element type code; UnsupportedOpError naming the type otherwise."""
    if code in ONNX_TO_DTYPE:
        return ONNX_TO_DTYPE[code]
    import onnx
    try:
        name = onnx.TensorProto.DataType.Name(code)
    except ValueError:
        raise OnnxModelError(f"{what} has unknown ONNX element type {code}") from None
    raise UnsupportedOpError(what, detail=f"element type {name} is not supported "
                             f"(edgerun holds {', '.join(d.value for d in DType)})")


@dataclass
class OnnxNode:
    """One ONNX node with its attributes decoded to Python values; missing optional inputs are ''."""

    op_type: str
    domain: str
    version: int  # the opset version of the node's domain in force for this node
    inputs: list[str]
    outputs: list[str]
    attrs: dict[str, Any] = field(default_factory=dict)
    name: str = ""

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def float_attr(self, key: str, default: float) -> float:
        """A FLOAT attribute: ONNX stores it, and its schema default, as float32, so a default such as 0.01 is
        rounded to float32 too (the value ONNX Runtime computes with; it shows in float64 graphs)."""
        return float(np.float32(self.attrs.get(key, default)))

    def has_input(self, i: int) -> bool:
        return len(self.inputs) > i and bool(self.inputs[i])

    def refuse(self, detail: str) -> UnsupportedOpError:
        return UnsupportedOpError(self.op_type, source=self.name or None, detail=detail)

    def refuse_at_bounds(self, detail: str) -> ShapeBoundsError:
        return ShapeBoundsError(self.op_type, source=self.name or None, detail=detail)


Out = str | np.ndarray  # an IR value name, or a constant computed at import time
Handler = Callable[["ImportContext", OnnxNode], list[Out]]


class ImportContext:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.b = Builder(graph)
        self.values: dict[str, str] = {}  # ONNX name -> IR value
        self.consts: dict[str, np.ndarray] = {}  # ONNX name -> constant known at import time
        self.producers: dict[str, list[str]] = {}  # ONNX output name -> its node's ONNX inputs
        # Element types of import-time values holding symbolic dimensions (object arrays; see symfold.py).
        self.symbolic_dtypes: dict[str, DType] = {}
        # Sizes cast to a float type (a grid's width as float for Range): computed at run time like any float
        # data, but remembered as sizes, so a Range up to one still has a symbolic length (shape.py: range_).
        self.float_sizes: dict[str, np.ndarray] = {}
        # Whether a relation between symbolic sizes that holds only at some sizes may be a guard checked per size
        # (a guarded reshape) rather than a refusal: the importer's last try for a model imported with no sizes.
        self.guarded = False
        # Inside a control-flow body (control_flow.py): a body is planned once for its node, so it cannot hold
        # a data-dependent op (data_dependent.py refuses one there).
        self.in_body = False
        # Sequences and empty optionals, resolved at import time (sequences.py): ONNX name -> its elements'
        # ONNX names, and the names of optionals that hold nothing.
        self.sequences: dict[str, list[str]] = {}
        self.absent: set[str] = set()

    def inputs_behind(self, name: str) -> list[str]:
        """The graph inputs an ONNX value is computed from (for messages: which input to freeze)."""
        found, seen, todo = set(), set(), [name]
        while todo:
            n = todo.pop()
            if n in seen or n in self.consts:
                continue
            seen.add(n)
            if n in self.graph.inputs:
                found.add(n)
            todo.extend(self.producers.get(n, []))
        return sorted(found)

    def bind_constant(self, name: str, arr: np.ndarray) -> None:
        """An ONNX value known at import time. A string tensor becomes a graph constant at once: `consts`
        holds numbers (and symbolic sizes, as object arrays) that import-time folding computes with."""
        if is_string_constant(arr):
            self.values[name] = self.graph.add_constant(np.require(arr, requirements="C"), hint="onnx_const")
        else:
            self.consts[name] = arr

    # -- reading inputs ------------------------------------------------------------------------------
    def known(self, name: str) -> bool:
        return name in self.values or name in self.consts

    def const(self, name: str) -> np.ndarray | None:
        """The numeric value of an ONNX input when it is known at import time, else None.

        Sizes that are symbolic (object arrays, symfold.py) count as unknown here: a handler computing with
        numbers gets them as run-time values. Handlers that take sizes (shape.py) read them with `static`.
        """
        arr = self.consts.get(name) if name else None
        return None if arr is None or arr.dtype == object else arr

    def value(self, name: str) -> str:
        """The IR value of an ONNX input, materialising a constant into the graph on first use."""
        if name in self.values:
            return self.values[name]
        if name in self.consts:
            arr = self.consts[name]
            if arr.dtype == object:
                self.values[name] = self._runtime_dims(arr, self.dtype(name))
                return self.values[name]
            try:
                DType.of(arr)
            except ValueError as exc:  # a constant of a type we cannot hold (float64, ...) is needed at run time
                raise UnsupportedOpError(name, detail=str(exc)) from None
            self.values[name] = self.graph.add_constant(np.require(arr, requirements="C"), hint="onnx_const")
            return self.values[name]
        raise OnnxModelError(f"value {name!r} is used before anything defines it")

    def input(self, node: OnnxNode, i: int) -> str:
        """IR value of input i ('' when the optional input is absent)."""
        return self.value(node.inputs[i]) if node.has_input(i) else ""

    def static(self, node: OnnxNode, i: int, what: str) -> np.ndarray | None:
        """Input i as a constant (None when absent; an object array when it holds symbolic sizes); refuse when it
        is computed at run time."""
        if not node.has_input(i):
            return None
        arr = self.consts.get(node.inputs[i])
        if arr is None:
            raise DynamicInputError(node.op_type, node.inputs[i], source=node.name or None, detail=(
                f"dynamic {what} input {node.inputs[i]!r} is not supported (it must be an initializer, "
                "a Constant, fold from static shapes, or be frozen with constant_inputs=)"))
        return arr

    def shape(self, name: str) -> tuple[Dim, ...]:
        if name in self.consts:
            return tuple(self.consts[name].shape)
        return self.graph.specs[self.value(name)].shape

    def dtype(self, name: str) -> DType:
        if name in self.consts:
            if self.consts[name].dtype == object:
                return self.symbolic_dtypes.get(name, DType.int64)
            return DType.of(self.consts[name])
        return self.graph.specs[self.value(name)].dtype

    def value_of_sizes(self, arr: np.ndarray) -> str:
        """An int64 array of sizes, some symbolic, as a run-time value (see _runtime_dims)."""
        return self._runtime_dims(arr, DType.int64)

    def _runtime_dims(self, arr: np.ndarray, dtype: DType) -> str:
        """An array of sizes, some symbolic, as a run-time value (one dim_value per symbolic size, a constant
        once the program is specialised): where shape arithmetic turns into data, such as a size cast to float
        or a comparison the symbols' bounds do not decide."""
        parts = []
        for d in arr.reshape(-1):
            one = self.emit("dim_value", [], value=d, dtype="int64") if isinstance(d, SymDim) else \
                self.b.const(np.asarray(int(d), dtype=np.int64))
            parts.append(self.emit("reshape", [one], shape=[1]))
        flat = parts[0] if len(parts) == 1 else self.emit("concat", parts, axis=0)
        return self.cast(self.emit("reshape", [flat], shape=list(arr.shape)), dtype)

    # -- emitting ------------------------------------------------------------------------------------
    def emit(self, op: str, inputs: list[str], **attrs: Any) -> str:
        return self.b.emit(op, inputs, **attrs)

    def scalar(self, value: float | int | bool, like: str) -> str:
        return self.b.scalar(value, like)

    def cast(self, x: str, dtype: DType) -> str:
        return x if self.b.dtype(x) is dtype else self.emit("cast", [x], dtype=dtype.value)
