"""IR ops as ONNX nodes (opset 20), and which of them ONNX Runtime's CPU kernels run exactly.

Each translator appends NodeProtos (and initializers) to an OnnxBuilder and never fails on a node that
`SUPPORTED` (atomic ops) or `COMPOSITES` (composites ORT runs as one kernel: Relu, Clip, Gelu, Softmax,
LayerNormalization, Resize, ConvTranspose) accepts; the tables are the contract, checked op by op against the reference kernels
in tests/backends. Composites arrive whole because the runtime keeps what a backend claims until
placement, so nothing here pattern-matches decomposed pieces back together. Where ONNX and the IR disagree at the edges (float -> int casts of NaN, integer division by
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
from edgerun.ir.ops.conv_transpose_ops import transpose_geometry
from edgerun.ir.region import regions_of

OPSET = 20  # 20: Gelu

F32 = frozenset({DType.float32})
# The types ONNX Runtime's CPU kernels cover for every op declared with them (int16/uint16 lack Max/Min/Where,
# the unsigned types Neg: those nodes stay on edgerun's kernels).
NUMERIC = frozenset({DType.float32, DType.float64, DType.int32, DType.int64})
FLOATS = frozenset({DType.float32, DType.float64})
BOOL = frozenset({DType.bool})
ANY = frozenset(DType)

# DType -> onnx.TensorProto enum value (fixed by the ONNX spec, so no onnx import is needed here).
ONNX_DTYPE = {DType.float32: 1, DType.uint8: 2, DType.int8: 3, DType.uint16: 4, DType.int16: 5, DType.int32: 6,
              DType.int64: 7, DType.bool: 9, DType.float16: 10, DType.float64: 11, DType.uint32: 12,
              DType.uint64: 13}


# Constants at least this large go to ORT as zero-copy OrtValues; smaller ones are serialised into the model.
EXTERNAL_CONSTANT_BYTES = 1024


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
        # Constants the translators make (reshaped weights, scales) of EXTERNAL_CONSTANT_BYTES or more: handed
        # to ORT as zero-copy OrtValues like the graph's own, not serialised (int4 scales: 20 MB for an LLM).
        self.large: dict[str, np.ndarray] = {}
        self._count = 0
        self._reshaped: dict[str, str] = {}  # Reshape output -> its input
        # Shapes, axes and pads the translators ask for again and again (a pitch tracker's rasters: 400+):
        # one initializer each, found again by value. (name, position among the initializers) so one a
        # failed reading deleted (emit_raster rolls back) is not handed out.
        self._ints: dict[tuple[int, ...], tuple[str, int]] = {}
        self.consumers = graph.consumers()
        self.producers = graph.producers()
        self.shared: dict[str, Any] = {}  # what translators make once per graph and read from several nodes
        # Output -> the input whose buffer a kernel updates in place (GroupQueryAttention's cache append): the
        # partition declares these (CompiledPartition.overwrites_inputs).
        self.overwrites: dict[str, str] = {}

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
                needed.update(reads(node))
        return keep[::-1]

    def const(self, value: np.ndarray, hint: str = "c") -> str:
        name = self.fresh(hint)
        value = np.ascontiguousarray(value)
        if value.nbytes >= EXTERNAL_CONSTANT_BYTES:
            self.large[name] = value
        else:
            self.initializers.append(self.numpy_helper.from_array(value, name))
        return name

    def ints(self, values: list[int] | tuple[int, ...], hint: str = "shape") -> str:
        key = tuple(int(v) for v in values)
        known = self._ints.get(key)
        if known is not None and known[1] < len(self.initializers) and self.initializers[known[1]].name == known[0]:
            return known[0]
        name = self.const(np.asarray(key, np.int64), hint)
        if self.initializers and self.initializers[-1].name == name:
            self._ints[key] = (name, len(self.initializers) - 1)
        return name


def reads(proto: Any) -> set[str]:
    """Every value an ONNX node reads: its inputs, and what its bodies (If, Loop, Scan) read from outside."""
    names = {i for i in proto.input if i}
    for attr in proto.attribute:
        if attr.type == 5:  # AttributeProto.GRAPH
            body = attr.g
            local = {vi.name for vi in body.input} | {t.name for t in body.initializer}
            local |= {o for n in body.node for o in n.output}
            used = {o.name for o in body.output}.union(*(reads(n) for n in body.node))
            names |= used - local
    return names


Translator = Callable[[OnnxBuilder, Node], None]
TRANSLATORS: dict[str, Translator] = {}
SUPPORTED: dict[str, OpSupport] = {}
COMPOSITES: dict[str, OpSupport] = {}


def _op(names: tuple[str, ...] | str, dtypes: frozenset[DType] | None,
        check: Callable[[Node, Graph], bool] | None = None, *,
        table: dict[str, OpSupport] = SUPPORTED) -> Callable[[Translator], Translator]:
    def deco(fn: Translator) -> Translator:
        for name in (names,) if isinstance(names, str) else names:
            TRANSLATORS[name] = fn
            table[name] = OpSupport(dtypes=dtypes, check=check)
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


@_op(("maximum", "minimum"), NUMERIC)
def _max_min(b: OnnxBuilder, node: Node) -> None:
    b.node("Max" if node.op == "maximum" else "Min", _inputs(node), list(node.outputs))


@_op("mul", NUMERIC)
def _mul(b: OnnxBuilder, node: Node) -> None:
    b.node("Mul", _inputs(node), list(node.outputs))


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
        b.node("Div", _inputs(node), list(node.outputs))
        return
    q = b.node("Div", _inputs(node))
    if rounding == "floor":
        b.node("Floor", [q], list(node.outputs))
        return
    negative = b.node("Less", [q, b.const(np.zeros((), np.float32))])
    b.node("Where", [negative, b.node("Ceil", [q]), b.node("Floor", [q])], list(node.outputs))


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
_GLOBAL_POOL = {"reduce_mean": "GlobalAveragePool"}  # GlobalMaxPool's NaN handling is not pinned: left out


@_op(tuple(_REDUCE), NUMERIC)
def _reduce(b: OnnxBuilder, node: Node) -> None:
    spec = b.graph.specs[node.inputs[0]]
    rank = spec.rank
    axes = node.attrs.get("axes")
    ins = _inputs(node)
    keepdims = bool(node.attrs.get("keepdims", False))
    if (node.op in _GLOBAL_POOL and spec.dtype == DType.float32 and rank >= 3 and axes is not None
            and sorted(int(a) % rank for a in axes) == list(range(2, rank))):
        # A mean over every spatial axis is ORT's GlobalAveragePool, which its NCHWc
        # layout pass keeps in blocked layout after the last conv; ReduceMean would first reorder the conv's
        # output back to NCHW (SqueezeNet's 1000x13x13 head: about 4% of the model's time on 2 cores).
        pooled = b.node(_GLOBAL_POOL[node.op], ins, list(node.outputs) if keepdims else None)
        if not keepdims:
            b.node("Reshape", [pooled, b.ints(list(b.graph.specs[node.outputs[0]].shape))], list(node.outputs))
        return
    if axes is not None:
        ins.append(b.ints(sorted(int(a) % max(rank, 1) for a in axes), "axes"))
        if not axes:  # an explicit empty list reduces nothing
            b.node("Identity", _inputs(node), list(node.outputs))
            return
    b.node(_REDUCE[node.op], ins, list(node.outputs), keepdims=int(keepdims))


@_op(("argmax", "argmin"), None, lambda n, g: g.specs[n.inputs[0]].dtype in NUMERIC and g.specs[n.inputs[0]].rank > 0)
def _arg(b: OnnxBuilder, node: Node) -> None:
    rank = b.graph.specs[node.inputs[0]].rank
    b.node("ArgMax" if node.op == "argmax" else "ArgMin", _inputs(node), list(node.outputs),
           axis=int(node.attrs.get("axis", 0)) % rank, keepdims=int(bool(node.attrs.get("keepdims", False))),
           select_last_index=int(bool(node.attrs.get("select_last_index", False))))


# ---- linear algebra, windows, gather -------------------------------------------------------------------

@_op("matmul", FLOATS)
def _matmul(b: OnnxBuilder, node: Node) -> None:
    a, c = node.inputs
    if b.graph.specs[a].rank == 2 and b.graph.specs[c].rank == 2 and b.graph.specs[a].dtype in (DType.float32, DType.float64):
        # An operand transposed in this partition (a training step's weight, read as [in, out] by the
        # forward; a cotangent read as [out, batch] by a weight's gradient): Gemm reads its source with
        # transA/transB instead of a Transpose copying it on every call. Constants never get here
        # transposed: the passes fold their transposes.
        ta, tc = _transposed_source(b, a), _transposed_source(b, c)
        if ta is not None or tc is not None:
            b.node("Gemm", [ta or a, tc or c], list(node.outputs), transA=int(ta is not None),
                   transB=int(tc is not None))
            return
    b.node("MatMul", _inputs(node), list(node.outputs))


def _transposed_source(b: OnnxBuilder, value: str) -> str | None:
    """For a [p, q] value that a one-region raster makes as the transpose of its source (of p*q elements,
    read as [q, p]): that source, as [q, p]; else None."""
    node = b.producers.get(value)
    if node is None or node.op != "raster" or node.attrs.get("fill") is not None or len(node.inputs) != 1:
        return None
    regions = regions_of(node.attrs)
    p, q = b.graph.specs[value].shape
    src = node.inputs[0]
    if len(regions) != 1 or regions[0].src != 0 or regions[0].numel != p * q or b.graph.specs[src].numel != p * q:
        return None
    if p * q > 1 << 22:
        return None
    dst_index, src_index = regions[0].index_grids()
    if not np.array_equal(src_index, (dst_index % q) * p + dst_index // q):
        return None
    return src if b.graph.specs[src].shape == (q, p) else b.node("Reshape", [src, b.ints([q, p])])


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


@_op("scatter_add", NUMERIC)
def _scatter_add(b: OnnxBuilder, node: Node) -> None:
    """ScatterND with reduction='add' (opset 16+), which sums repeated indices. Along axis 0 each index is one
    row of ScatterND's [..., 1] index; along another axis the data is seen as [pre, rows, post] and each
    update's index is (its pre position, the row), so no transpose is copied. Negative indices wrap here."""
    data, idx, updates = node.inputs
    shape = b.graph.specs[data].shape
    axis = int(node.attrs.get("axis", 0)) % len(shape)
    rows = shape[axis]
    ispec = b.graph.specs[idx]
    if ispec.dtype is not DType.int64:
        idx = b.node("Cast", [idx], to=ONNX_DTYPE[DType.int64])
    zero, size = b.const(np.array(0, np.int64), "zero"), b.const(np.array(rows, np.int64), "rows")
    idx = b.node("Where", [b.node("Less", [idx, zero]), b.node("Add", [idx, size]), idx])
    if axis == 0:
        b.node("ScatterND", [data, b.node("Unsqueeze", [idx, b.ints([-1], "axes")]), updates], list(node.outputs),
               reduction="add")
        return
    pre, post, n = int(np.prod(shape[:axis])), int(np.prod(shape[axis + 1:])), ispec.numel
    where = b.node("Expand", [b.node("Reshape", [idx, b.ints([1, n, 1])]), b.ints([pre, n, 1])])
    outer = b.const(np.broadcast_to(np.arange(pre, dtype=np.int64).reshape(pre, 1, 1), (pre, n, 1)).copy(), "pre")
    index = b.node("Concat", [outer, where], axis=2)
    summed = b.node("ScatterND", [b.node("Reshape", [data, b.ints([pre, rows, post])]), index,
                                  b.node("Reshape", [updates, b.ints([pre, n, post])])], reduction="add")
    b.node("Reshape", [summed, b.ints(list(shape))], list(node.outputs))


# ---- composites ORT runs as one kernel -----------------------------------------------------------------

@_op("relu", F32, table=COMPOSITES)
def _relu(b: OnnxBuilder, node: Node) -> None:
    b.node("Relu", _inputs(node), list(node.outputs))


@_op("clamp", F32, table=COMPOSITES)
def _clip(b: OnnxBuilder, node: Node) -> None:
    # Clip (ORT fuses it into the Conv or MatMul before it); a bound of None is an omitted input.
    bounds = [b.const(np.array(node.attrs[k], np.float32)) if node.attrs.get(k) is not None else ""
              for k in ("min", "max")]
    b.node("Clip", [node.inputs[0], *bounds], list(node.outputs))


@_op("gelu", F32, table=COMPOSITES)
def _gelu(b: OnnxBuilder, node: Node) -> None:
    b.node("Gelu", _inputs(node), list(node.outputs), approximate=str(node.attrs.get("approximate", "none")))


@_op("softmax", F32, table=COMPOSITES)
def _softmax(b: OnnxBuilder, node: Node) -> None:
    rank = b.graph.specs[node.inputs[0]].rank
    b.node("Softmax", _inputs(node), list(node.outputs), axis=int(node.attrs.get("axis", -1)) % max(rank, 1))


def _layer_norm_params_fit(node: Node, graph: Graph) -> bool:
    # LayerNormalization wants scale and bias shaped like the normalised axes; the IR also allows shorter
    # broadcasting ones, which stay with the reference (decomposed).
    x = graph.specs[node.inputs[0]].shape
    n = int(node.attrs.get("normalized_ndim", 1))
    return all(graph.specs[v].shape == x[len(x) - n:] for v in node.inputs[1:] if v)


@_op("layer_norm", F32, _layer_norm_params_fit, table=COMPOSITES)
def _layer_norm(b: OnnxBuilder, node: Node) -> None:
    x = node.inputs[0]
    shape = b.graph.specs[x].shape
    n = int(node.attrs.get("normalized_ndim", 1))
    scale = node.inputs[1] if len(node.inputs) > 1 and node.inputs[1] else \
        b.const(np.ones(shape[len(shape) - n:], np.float32), "ln_scale")
    bias = [node.inputs[2]] if len(node.inputs) > 2 and node.inputs[2] else []
    b.node("LayerNormalization", [x, scale, *bias], list(node.outputs), axis=len(shape) - n,
           epsilon=float(node.attrs.get("eps", 1e-5)))


@_op("resize", F32, table=COMPOSITES)
def _resize(b: OnnxBuilder, node: Node) -> None:
    # ORT sizes the output as floor(scale * size) in float32; where that is the shape, the scales go over
    # (the coordinates are mapped with them, as in the model), else the sizes (ORT maps with size ratios).
    x = node.inputs[0]
    shape = b.graph.specs[x].shape
    out = [int(n) for n in node.attrs["shape"]]
    scales = np.asarray(node.attrs["scales"], np.float32)
    if [int(s * np.float32(n)) for s, n in zip(scales, shape)] == out:
        sizing = ["", b.const(scales, "resize_scales")]
    else:
        sizing = ["", "", b.ints(out, "resize_sizes")]
    attrs = {"mode": node.attrs["mode"], "coordinate_transformation_mode": node.attrs["coordinate_transformation_mode"]}
    if node.attrs["mode"] == "nearest":
        attrs["nearest_mode"] = node.attrs["nearest_mode"]
    b.node("Resize", [x, *sizing], list(node.outputs), **attrs)


def _crops(node: Node, graph: Graph) -> bool:
    return min(transpose_geometry(node.attrs)[2]) >= 0  # ONNX pads only crop; an extending one stays lowered


@_op("conv_transpose2d", F32, _crops, table=COMPOSITES)
def _conv_transpose(b: OnnxBuilder, node: Node) -> None:
    stride, dil, pads, out_pad, groups = transpose_geometry(node.attrs)
    kernel = list(b.graph.specs[node.inputs[1]].shape[2:])
    b.node("ConvTranspose", [v for v in node.inputs if v], list(node.outputs), kernel_shape=kernel,
           strides=list(stride), dilations=list(dil), pads=list(pads), output_padding=list(out_pad), group=groups)
