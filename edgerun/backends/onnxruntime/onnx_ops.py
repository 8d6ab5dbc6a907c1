"""Atomic IR ops as ONNX nodes (opset 18), and which of them ONNX Runtime's CPU kernels run exactly.

Each translator appends NodeProtos (and initializers) to an OnnxBuilder and never fails on a node that
`SUPPORTED` accepts; the support table is the contract, checked op by op against the reference kernels in
tests/backends. Where ONNX and the IR disagree at the edges (float -> int casts of NaN, integer division by
zero, Python-style float modulo) the op is simply not claimed, and the search leaves it on the reference.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from edgerun.backends.base import OpSupport
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.ops.atomic import conv_geometry, pool_geometry

OPSET = 18

F32 = frozenset({DType.float32})
NUMERIC = frozenset({DType.float32, DType.int32, DType.int64})
BOOL = frozenset({DType.bool})
ANY = frozenset(DType)

# DType -> onnx.TensorProto enum value (fixed by the ONNX spec, so no onnx import is needed here).
ONNX_DTYPE = {DType.float32: 1, DType.uint8: 2, DType.int8: 3, DType.int32: 6, DType.int64: 7,
              DType.bool: 9, DType.float16: 10}


class OnnxBuilder:
    """Collects nodes and initializers of one ONNX graph; names every intermediate it makes."""

    def __init__(self, graph: Graph) -> None:
        import onnx.helper
        import onnx.numpy_helper

        self.helper = onnx.helper
        self.numpy_helper = onnx.numpy_helper
        self.graph = graph
        self.nodes: list[Any] = []
        self.initializers: list[Any] = []
        self._count = 0
        self._reshaped: dict[str, str] = {}  # Reshape output -> its input
        self.consumers = graph.consumers()
        self.producers = graph.producers()
        self.pending_clip: dict[str, tuple[str, float]] = {}  # max(x, lo) outputs folded into their min

    def fresh(self, hint: str) -> str:
        self._count += 1
        return f"_ort_{hint}_{self._count}"

    def node(self, op_type: str, inputs: list[str], outputs: list[str] | None = None, **attrs: Any) -> str:
        outputs = outputs or [self.fresh(op_type.lower())]
        if op_type == "Reshape" and inputs[0] in self._reshaped:
            inputs = [self._reshaped[inputs[0]], *inputs[1:]]  # a reshape of a reshape reads the original
        if op_type == "Reshape":
            self._reshaped[outputs[0]] = inputs[0]
        self.nodes.append(self.helper.make_node(op_type, inputs, outputs, **attrs))
        return outputs[0]

    def live_nodes(self, outputs: list[str]) -> list[Any]:
        """The nodes some output depends on, in order (patterns tried and reshapes bypassed leave dead ones)."""
        needed = set(outputs)
        keep = []
        for node in reversed(self.nodes):
            if needed.intersection(node.output):
                keep.append(node)
                needed.update(node.input)
        return keep[::-1]

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        name = self.fresh(hint)
        self.initializers.append(self.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def ints(self, values: list[int] | tuple[int, ...], hint: str = "shape") -> str:
        return self.const(np.asarray(values, np.int64), hint)


Translator = Callable[[OnnxBuilder, Node], None]
TRANSLATORS: dict[str, Translator] = {}
SUPPORTED: dict[str, OpSupport] = {}


def _op(names: tuple[str, ...] | str, dtypes: frozenset[DType] | None,
        check: Callable[[Node, Graph], bool] | None = None) -> Callable[[Translator], Translator]:
    def deco(fn: Translator) -> Translator:
        for name in (names,) if isinstance(names, str) else names:
            TRANSLATORS[name] = fn
            SUPPORTED[name] = OpSupport(dtypes=dtypes, check=check)
        return fn
    return deco


def _inputs(node: Node) -> list[str]:
    return list(node.inputs)


# ---- elementwise: one ONNX op each ---------------------------------------------------------------------
_DIRECT_FLOAT = {"exp": "Exp", "log": "Log", "sqrt": "Sqrt", "tanh": "Tanh", "sigmoid": "Sigmoid", "erf": "Erf",
                 "sin": "Sin", "cos": "Cos", "floor": "Floor", "ceil": "Ceil", "round": "Round",
                 "reciprocal": "Reciprocal", "pow": "Pow"}
_DIRECT_NUMERIC = {"add": "Add", "sub": "Sub", "mul": "Mul", "maximum": "Max", "minimum": "Min",
                   "neg": "Neg", "abs": "Abs", "sign": "Sign"}
_DIRECT_BOOL = {"logical_and": "And", "logical_or": "Or", "logical_xor": "Xor", "logical_not": "Not"}
_COMPARE = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual"}


def _direct(table: dict[str, str]) -> Translator:
    def run(b: OnnxBuilder, node: Node) -> None:
        b.node(table[node.op], _inputs(node), list(node.outputs))
    return run


for _table, _dtypes in ((_DIRECT_FLOAT, F32), (_DIRECT_NUMERIC, NUMERIC), (_DIRECT_BOOL, None)):
    _op(tuple(_table), _dtypes)(_direct(_table))


def _scalar_bound(b: OnnxBuilder, node: Node) -> tuple[str, float] | None:
    """(tensor, bound) when `node` is max/min of a float32 tensor and a scalar constant of no larger shape."""
    x, c = node.inputs
    if x in b.graph.constants:
        x, c = c, x
    value = b.graph.constants.get(c)
    spec = b.graph.specs[x]
    if value is None or value.size != 1 or spec.dtype is not DType.float32 \
            or b.graph.specs[node.outputs[0]].shape != spec.shape:
        return None
    return x, float(value.reshape(()))


@_op(("maximum", "minimum"), NUMERIC)
def _clamp(b: OnnxBuilder, node: Node) -> None:
    # max(x, 0) as Relu and max/min against a constant as Clip: ORT fuses those into the producing Conv
    # (it does not fuse Max/Min), and a max(x, lo) read only by a min(., hi) becomes one Clip(x, lo, hi).
    bound = _scalar_bound(b, node)
    if bound is None:
        b.node("Max" if node.op == "maximum" else "Min", _inputs(node), list(node.outputs))
        return
    x, value = bound
    if node.op == "maximum":
        readers = b.consumers.get(node.outputs[0], [])
        if len(readers) == 1 and readers[0].op == "minimum" and node.outputs[0] not in b.graph.outputs \
                and _scalar_bound(b, readers[0]) is not None:
            b.pending_clip[node.outputs[0]] = (x, value)
            return
        if value == 0.0:
            b.node("Relu", [x], list(node.outputs))
        else:
            b.node("Clip", [x, b.const(np.array(value, np.float32))], list(node.outputs))
        return
    low = b.pending_clip.pop(x, None)
    if low is not None:
        b.node("Clip", [low[0], b.const(np.array(low[1], np.float32)), b.const(np.array(value, np.float32))], list(node.outputs))
    else:
        b.node("Clip", [x, "", b.const(np.array(value, np.float32))], list(node.outputs))


@_op("mul", NUMERIC)
def _mul(b: OnnxBuilder, node: Node) -> None:
    norm = _layer_norm_source(b, node)
    if norm is None:
        b.node("Mul", _inputs(node), list(node.outputs))
        return
    x, axis, eps = norm
    scale = np.ones(b.graph.specs[x].shape[axis:], np.float32)
    b.node("LayerNormalization", [x, b.const(scale, "ln_scale")], list(node.outputs), axis=axis, epsilon=eps)


def _layer_norm_source(b: OnnxBuilder, node: Node) -> tuple[str, int, float] | None:
    """(x, first axis, eps) when `node` is (x - mean) * rsqrt(mean((x - mean)^2) + eps) over trailing axes, as
    layer_norm decomposes: one LayerNormalization instead of eight passes over the activations."""
    made = b.producers
    centered, inv = (made.get(v) for v in node.inputs)
    if inv is not None and inv.op == "sub":
        centered, inv = inv, centered
    if centered is None or inv is None or centered.op != "sub" or inv.op != "rsqrt" \
            or b.graph.specs[node.inputs[0]].dtype is not DType.float32:
        return None
    x, mean = centered.inputs[0], made.get(centered.inputs[1])
    plus_eps = made.get(inv.inputs[0])
    if mean is None or mean.op != "reduce_mean" or mean.inputs[0] != x or plus_eps is None or plus_eps.op != "add":
        return None
    var, eps = plus_eps.inputs
    if var in b.graph.constants:
        var, eps = eps, var
    var_node, eps_value = made.get(var), b.graph.constants.get(eps)
    if var_node is None or var_node.op != "reduce_mean" or eps_value is None or eps_value.size != 1:
        return None
    square = made.get(var_node.inputs[0])
    if square is None or square.op != "mul" or square.inputs != [centered.outputs[0]] * 2:
        return None
    rank = b.graph.specs[x].rank
    axes = [sorted(int(a) % max(rank, 1) for a in (n.attrs.get("axes") or [])) for n in (mean, var_node)]
    if not axes[0] or axes[0] != axes[1] or axes[0] != list(range(axes[0][0], rank)) \
            or not (mean.attrs.get("keepdims") and var_node.attrs.get("keepdims")):
        return None
    return x, axes[0][0], float(eps_value.reshape(()))


def _compare_inputs_numeric(node: Node, graph: Graph) -> bool:
    return graph.specs[node.inputs[0]].dtype in NUMERIC


_op(tuple(_COMPARE), None, _compare_inputs_numeric)(_direct(_COMPARE))


@_op("ne", None, _compare_inputs_numeric)
def _ne(b: OnnxBuilder, node: Node) -> None:
    b.node("Not", [b.node("Equal", _inputs(node))], list(node.outputs))


@_op("rsqrt", F32)
def _rsqrt(b: OnnxBuilder, node: Node) -> None:
    # 1/sqrt(x), two roundings, exactly as the reference computes it.
    b.node("Reciprocal", [b.node("Sqrt", _inputs(node))], list(node.outputs))


def _float_div_only(node: Node, graph: Graph) -> bool:
    return graph.specs[node.inputs[0]].dtype is DType.float32


@_op("div", F32, _float_div_only)
def _div(b: OnnxBuilder, node: Node) -> None:
    rounding = node.attrs.get("rounding", "none")
    if rounding == "none":
        softmax = _softmax_source(b, node)
        if softmax is not None:
            b.node("Softmax", [softmax[0]], list(node.outputs), axis=softmax[1])
            return
        b.node("Div", _inputs(node), list(node.outputs))
        return
    q = b.node("Div", _inputs(node))
    if rounding == "floor":
        b.node("Floor", [q], list(node.outputs))
        return
    negative = b.node("Less", [q, b.const(np.zeros((), np.float32))])
    b.node("Where", [negative, b.node("Ceil", [q]), b.node("Floor", [q])], list(node.outputs))


def _softmax_source(b: OnnxBuilder, node: Node) -> tuple[str, int] | None:
    """(x, axis) when `node` is the last step of softmax's decomposition, exp(x - max) / sum(exp(x - max)),
    all inside this partition: it becomes one Softmax (the steps it replaces are pruned unless read
    elsewhere). One ONNX op instead of five, and one pass over the data instead of five."""
    made = b.producers
    exp, total = (made.get(v) for v in node.inputs)
    if exp is None or total is None or exp.op != "exp" or total.op != "reduce_sum":
        return None
    summed = made.get(total.inputs[0])
    shifted = made.get(exp.inputs[0])
    if summed is None or summed.op != "exp" or summed.inputs != exp.inputs or shifted is None \
            or shifted.op != "sub":
        return None
    x, peak = shifted.inputs[0], made.get(shifted.inputs[1])
    if peak is None or peak.op != "reduce_max" or peak.inputs[0] != x:
        return None
    rank = b.graph.specs[x].rank
    axes = [[int(a) % max(rank, 1) for a in (n.attrs.get("axes") or [])] for n in (total, peak)]
    if len(axes[0]) != 1 or axes[0] != axes[1] or not all(n.attrs.get("keepdims") for n in (total, peak)):
        return None
    return x, axes[0][0]


def _fmod_or_int(node: Node, graph: Graph) -> bool:
    # ONNX Mod on floats needs fmod=1; Python-style float remainder would be a composition with its own
    # rounding, so it stays on the reference. Integer modulo by zero errors there and not here: ints out too.
    return bool(node.attrs.get("fmod"))


@_op("mod", F32, _fmod_or_int)
def _mod(b: OnnxBuilder, node: Node) -> None:
    b.node("Mod", _inputs(node), list(node.outputs), fmod=1)


@_op("where", None, lambda n, g: g.specs[n.inputs[1]].dtype in NUMERIC)
def _where(b: OnnxBuilder, node: Node) -> None:
    b.node("Where", _inputs(node), list(node.outputs))


def _cast_is_exact(node: Node, graph: Graph) -> bool:
    src = graph.specs[node.inputs[0]].dtype
    dst = DType(node.attrs["dtype"])
    # float -> int: the reference pins NaN to 0 and saturates; ONNX leaves both undefined.
    return not (src.is_float and not dst.is_float) and src in ONNX_DTYPE and dst in ONNX_DTYPE


@_op("cast", None, _cast_is_exact)
def _cast(b: OnnxBuilder, node: Node) -> None:
    b.node("Cast", _inputs(node), list(node.outputs), to=ONNX_DTYPE[DType(node.attrs["dtype"])])


# ---- reductions ----------------------------------------------------------------------------------------
_REDUCE = {"reduce_sum": "ReduceSum", "reduce_mean": "ReduceMean", "reduce_max": "ReduceMax",
           "reduce_min": "ReduceMin"}


@_op(tuple(_REDUCE), NUMERIC)
def _reduce(b: OnnxBuilder, node: Node) -> None:
    rank = b.graph.specs[node.inputs[0]].rank
    axes = node.attrs.get("axes")
    ins = _inputs(node)
    if axes is not None:
        ins.append(b.ints(sorted(int(a) % max(rank, 1) for a in axes), "axes"))
        if not axes:  # an explicit empty list reduces nothing
            b.node("Identity", _inputs(node), list(node.outputs))
            return
    b.node(_REDUCE[node.op], ins, list(node.outputs), keepdims=int(bool(node.attrs.get("keepdims", False))))


@_op(("argmax", "argmin"), None, lambda n, g: g.specs[n.inputs[0]].dtype in NUMERIC and g.specs[n.inputs[0]].rank > 0)
def _arg(b: OnnxBuilder, node: Node) -> None:
    rank = b.graph.specs[node.inputs[0]].rank
    b.node("ArgMax" if node.op == "argmax" else "ArgMin", _inputs(node), list(node.outputs),
           axis=int(node.attrs.get("axis", 0)) % rank, keepdims=int(bool(node.attrs.get("keepdims", False))),
           select_last_index=int(bool(node.attrs.get("select_last_index", False))))


# ---- linear algebra, windows, gather -------------------------------------------------------------------

@_op("matmul", F32)
def _matmul(b: OnnxBuilder, node: Node) -> None:
    b.node("MatMul", _inputs(node), list(node.outputs))


@_op("conv2d", F32)
def _conv(b: OnnxBuilder, node: Node) -> None:
    stride, pads, dil, groups = conv_geometry(node.attrs)
    w = b.graph.specs[node.inputs[1]].shape
    ins = [i for i in node.inputs if i]
    # IR padding is [top, left, bottom, right]; ONNX wants [x1_begin, x2_begin, x1_end, x2_end]: the same.
    b.node("Conv", ins, list(node.outputs), kernel_shape=[w[2], w[3]], strides=list(stride), pads=list(pads),
           dilations=list(dil), group=groups)


def _pool_ok(node: Node, graph: Graph) -> bool:
    _, _, _, dil, _ = pool_geometry(node.attrs)
    return node.op == "max_pool2d" or dil == (1, 1)


@_op(("max_pool2d", "avg_pool2d"), F32, _pool_ok)
def _pool(b: OnnxBuilder, node: Node) -> None:
    kernel, stride, pads, dil, ceil_mode = pool_geometry(node.attrs)
    attrs: dict[str, Any] = {"kernel_shape": list(kernel), "strides": list(stride), "pads": list(pads),
                             "ceil_mode": int(ceil_mode)}
    if node.op == "max_pool2d":
        b.node("MaxPool", _inputs(node), list(node.outputs), dilations=list(dil), **attrs)
    else:
        b.node("AveragePool", _inputs(node), list(node.outputs),
               count_include_pad=int(bool(node.attrs.get("count_include_pad", True))), **attrs)


@_op("gather", None, lambda n, g: g.specs[n.inputs[0]].dtype in ONNX_DTYPE)
def _gather(b: OnnxBuilder, node: Node) -> None:
    rank = b.graph.specs[node.inputs[0]].rank
    b.node("Gather", _inputs(node), list(node.outputs), axis=int(node.attrs.get("axis", 0)) % max(rank, 1))
