"""Atomic ops: the kernels every backend implements. The set is kept small on purpose; each op says why it is here.

Conventions that keep backends simple:
- Binary and ternary elementwise ops broadcast numpy-style but need inputs of ONE dtype; frontends insert
  `cast` where the source framework promotes.
- Layouts are NCHW; convolution padding is [top, left, bottom, right].
- Reductions take `axes` (None: all) and `keepdims`.
"""

from __future__ import annotations

import math
from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.ops._rules import broadcast_shapes, norm_axes, norm_axis, require_float, same_dtype
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.symbolic import SymbolicShapeError, is_symbolic
from edgerun.ir.tensor_spec import TensorSpec

Attrs = dict[str, Any]

# ---- unary elementwise -------------------------------------------------------------------------------
# Each is a transcendental or rounding primitive that cannot be built exactly from the others at fp32
# precision (sigmoid and erf would lose accuracy or stability as compositions; tanh is the classic place
# a fast-math backend goes wrong, so it must be separately checkable).
UNARY_FLOAT = {
    "exp": "e^x; softmax, SiLU, sigmoid-like activations",
    "log": "natural log; log-softmax, losses",
    "sqrt": "square root; norms",
    "rsqrt": "1/sqrt(x) in one rounding; layer/RMS norm",
    "tanh": "tanh; GELU (tanh form), RNN gates",
    "sigmoid": "1/(1+e^-x), stable for large |x|; SiLU, gates",
    "erf": "error function; exact GELU",
    "sin": "sine; rotary position embeddings",
    "cos": "cosine; rotary position embeddings",
    "floor": "round down; index arithmetic, quantisation",
    "ceil": "round up",
    "round": "round half to even; quantisation",
}
UNARY_ANY = {
    "neg": "negation (also integers)",
    "abs": "absolute value (also integers)",
    "sign": "-1, 0 or 1",
    "reciprocal": "1/x",
}


def _unary_float_rule(op: str):
    def rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
        require_float(ins[0], op)
        return [ins[0]]
    return rule


def _same_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    return [ins[0]]


for _name, _why in UNARY_FLOAT.items():
    register(OpDef(_name, OpKind.ATOMIC, _unary_float_rule(_name), 1, 1, doc=_why, family="unary"))
for _name, _why in UNARY_ANY.items():
    register(OpDef(_name, OpKind.ATOMIC, _same_rule, 1, 1, doc=_why, family="unary"))


def _logical_not_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    if ins[0].dtype is not DType.bool:
        raise ValueError("logical_not needs a bool input")
    return [ins[0]]


register(OpDef("logical_not", OpKind.ATOMIC, _logical_not_rule, 1, 1, doc="boolean not; masks", family="unary"))

# ---- binary elementwise ------------------------------------------------------------------------------
BINARY_ARITH = {
    "add": "a+b", "sub": "a-b", "mul": "a*b",
    "div": "a/b; attr rounding: 'none' (true division; truncates for integers), 'floor' or 'trunc'",
    "pow": "a**b; norms, GELU-tanh cubic",
    "maximum": "elementwise max; ReLU, clamp", "minimum": "elementwise min; clamp",
    "mod": "remainder; attr fmod=False gives the sign of the divisor (Python), True the dividend's (C)",
}
BINARY_LOGICAL = {"logical_and": "boolean and", "logical_or": "boolean or", "logical_xor": "boolean xor"}
COMPARISONS = {"eq": "a==b", "ne": "a!=b", "lt": "a<b", "le": "a<=b", "gt": "a>b", "ge": "a>=b"}


def _binary_rule(op: str, out_dtype: DType | None = None, need_bool: bool = False):
    def rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
        dtype = same_dtype(ins, op)
        if need_bool and dtype is not DType.bool:
            raise ValueError(f"{op} needs bool inputs")
        if op == "div" and attrs.get("rounding", "none") not in ("none", "floor", "trunc"):
            raise ValueError(f"div rounding must be none, floor or trunc, got {attrs.get('rounding')!r}")
        return [TensorSpec(broadcast_shapes(ins[0].shape, ins[1].shape), out_dtype or dtype)]
    return rule


for _name, _why in BINARY_ARITH.items():
    register(OpDef(_name, OpKind.ATOMIC, _binary_rule(_name), 2, 2, doc=_why, family="binary"))
for _name, _why in BINARY_LOGICAL.items():
    register(OpDef(_name, OpKind.ATOMIC, _binary_rule(_name, need_bool=True), 2, 2, doc=_why, family="binary"))
for _name, _why in COMPARISONS.items():
    register(OpDef(_name, OpKind.ATOMIC, _binary_rule(_name, DType.bool), 2, 2, doc=_why, family="compare"))


def _where_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    cond, a, b = ins
    if cond.dtype is not DType.bool:
        raise ValueError("where needs a bool condition")
    dtype = same_dtype([a, b], "where")
    return [TensorSpec(broadcast_shapes(cond.shape, a.shape, b.shape), dtype)]


register(OpDef("where", OpKind.ATOMIC, _where_rule, 3, 3,
               doc="select by mask; masking (attention, ReLU-like ops) without control flow"))


def _cast_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    return [TensorSpec(ins[0].shape, DType(attrs["dtype"]))]


register(OpDef("cast", OpKind.ATOMIC, _cast_rule, 1, 1,
               doc="convert element type (attr dtype); float->int truncates toward zero; to float8, attr saturate "
                   "(default true) clamps to the largest finite value; to float8e8m0, attr round_mode (up, down, "
                   "nearest)"))

def _bitcast_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    to = DType(attrs["dtype"])
    if ins[0].dtype.is_narrow or to.is_narrow or ins[0].dtype.itemsize != to.itemsize:
        raise ValueError(f"bitcast from {ins[0].dtype.value} to {to.value}: the two types must be stored in the "
                         "same number of bytes (and not be a narrow type, held one per byte)")
    return [TensorSpec(ins[0].shape, to)]


register(OpDef("bitcast", OpKind.ATOMIC, _bitcast_rule, 1, 1,
               doc="reinterpret each element's bytes as another type of the same width (attr dtype); ONNX BitCast, "
                   "float bit tricks; no arithmetic can express it (NaN payloads, -0.0)"))

# ---- reductions --------------------------------------------------------------------------------------


def _reduced_shape(spec: TensorSpec, attrs: Attrs) -> tuple[int, ...]:
    axes = norm_axes(attrs.get("axes"), spec.rank)
    keep = bool(attrs.get("keepdims", False))
    return tuple(1 if i in axes else d for i, d in enumerate(spec.shape) if keep or i not in axes)


def _reduce_rule(op: str):
    def rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
        if op == "reduce_mean":
            require_float(ins[0], op)
        if op in ("reduce_max", "reduce_min") and ins[0].numel == 0:
            raise ValueError(f"{op} of an empty tensor")
        return [TensorSpec(_reduced_shape(ins[0], attrs), ins[0].dtype)]
    return rule


REDUCTIONS = {
    "reduce_sum": "sum over axes; every norm, softmax and pooling-like op",
    "reduce_mean": "mean over axes; kept apart from sum so backends can accumulate at higher precision",
    "reduce_max": "max over axes; stable softmax, global max pooling",
    "reduce_min": "min over axes",
}
for _name, _why in REDUCTIONS.items():
    register(OpDef(_name, OpKind.ATOMIC, _reduce_rule(_name), 1, 1, doc=_why, family="reduce"))


def _arg_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    spec = ins[0]
    axis = norm_axis(int(attrs.get("axis", 0)), spec.rank)
    if spec.rank and spec.shape[axis] == 0:
        raise ValueError("argmax/argmin over an empty axis")
    shape = _reduced_shape(spec, {"axes": [axis], "keepdims": attrs.get("keepdims", False)})
    return [TensorSpec(shape, DType.int64)]


register(OpDef("argmax", OpKind.ATOMIC, _arg_rule, 1, 1,
               doc="index of the max along axis (first on ties; attr select_last_index); classification, decoding"))
register(OpDef("argmin", OpKind.ATOMIC, _arg_rule, 1, 1, doc="index of the min along axis"))

# ---- linear algebra and windows ----------------------------------------------------------------------


def _matmul_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    a, b = ins
    dtype = same_dtype(ins, "matmul")
    if a.rank < 2 or b.rank < 2:
        raise ValueError(f"matmul needs rank >= 2 operands (frontends reshape vectors), got {a} @ {b}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul inner dimensions differ: {a} @ {b}")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    return [TensorSpec((*batch, a.shape[-2], b.shape[-1]), dtype)]


register(OpDef("matmul", OpKind.ATOMIC, _matmul_rule, 2, 2,
               doc="batched matrix product with broadcast batch dims; linear layers, attention"))


def _window_out(size: int, k: int, stride: int, pad0: int, pad1: int, dilation: int, ceil_mode: bool) -> int:
    span = dilation * (k - 1) + 1
    num = size + pad0 + pad1 - span
    if is_symbolic(num):
        # Checked per concrete shape at specialisation; ceil mode's dropped last window needs the value.
        if ceil_mode:
            raise SymbolicShapeError(f"ceil_mode pooling over symbolic dimension {str(size)!r} needs a concrete size")
        return num // stride + 1
    if num < 0:
        raise ValueError(f"window of {span} does not fit input of {size} with padding {pad0}+{pad1}")
    out = (math.ceil(num / stride) if ceil_mode else num // stride) + 1
    # A window that would start inside the end padding is dropped (PyTorch and ONNX agree on this).
    if ceil_mode and (out - 1) * stride >= size + pad0:
        out -= 1
    return out


def _pair(v: Any, name: str) -> tuple[int, int]:
    if isinstance(v, int):
        return (v, v)
    if len(v) != 2:
        raise ValueError(f"{name} needs 2 values, got {v}")
    return (int(v[0]), int(v[1]))


def _pads(v: Any) -> tuple[int, int, int, int]:
    if v is None:
        return (0, 0, 0, 0)
    if len(v) != 4:
        raise ValueError(f"padding needs [top, left, bottom, right], got {v}")
    return (int(v[0]), int(v[1]), int(v[2]), int(v[3]))


def conv_geometry(attrs: Attrs) -> tuple[tuple[int, int], tuple[int, int, int, int], tuple[int, int], int]:
    """(stride, padding, dilation, groups) of a conv2d node with defaults applied."""
    return (_pair(attrs.get("stride", 1), "stride"), _pads(attrs.get("padding")),
            _pair(attrs.get("dilation", 1), "dilation"), int(attrs.get("groups", 1)))


def _conv_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    from edgerun.ir.builder import absent
    x, w = ins[0], ins[1]
    dtype = same_dtype([x, w], "conv2d")
    require_float(x, "conv2d")
    if x.rank != 4 or w.rank != 4:
        raise ValueError(f"conv2d needs NCHW input and OIHW weight, got {x} and {w}")
    stride, pads, dil, groups = conv_geometry(attrs)
    if groups < 1 or x.shape[1] != w.shape[1] * groups or w.shape[0] % groups:
        raise ValueError(f"conv2d channels do not fit groups={groups}: input {x}, weight {w}")
    if min(stride) < 1 or min(dil) < 1 or min(pads) < 0:
        raise ValueError("conv2d stride and dilation must be >= 1 and padding >= 0")
    if len(ins) == 3 and not absent(ins[2]) and (ins[2].shape != (w.shape[0],) or ins[2].dtype != dtype):
        raise ValueError(f"conv2d bias must be {dtype.value}[{w.shape[0]}], got {ins[2]}")
    h = _window_out(x.shape[2], w.shape[2], stride[0], pads[0], pads[2], dil[0], False)
    wd = _window_out(x.shape[3], w.shape[3], stride[1], pads[1], pads[3], dil[1], False)
    return [TensorSpec((x.shape[0], w.shape[0], h, wd), dtype)]


register(OpDef("conv2d", OpKind.ATOMIC, _conv_rule, 2, 3,
               doc="2-D convolution (stride, padding, dilation, groups; optional bias); the CNN workhorse, "
                   "kept atomic because every accelerator has a dedicated path for it"))


def pool_geometry(attrs: Attrs) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int],
                                          tuple[int, int], bool]:
    """(kernel, stride, padding, dilation, ceil_mode) of a pooling node with defaults applied."""
    kernel = _pair(attrs["kernel"], "kernel")
    stride = _pair(attrs.get("stride") or kernel, "stride")
    return (kernel, stride, _pads(attrs.get("padding")), _pair(attrs.get("dilation", 1), "dilation"),
            bool(attrs.get("ceil_mode", False)))


def _pool_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x = ins[0]
    if x.rank != 4:
        raise ValueError(f"pooling needs an NCHW input, got {x}")
    kernel, stride, pads, dil, ceil_mode = pool_geometry(attrs)
    if pads[0] * 2 > kernel[0] * dil[0] or pads[1] * 2 > kernel[1] * dil[1]:
        raise ValueError("pool padding must be at most half the kernel")
    h = _window_out(x.shape[2], kernel[0], stride[0], pads[0], pads[2], dil[0], ceil_mode)
    w = _window_out(x.shape[3], kernel[1], stride[1], pads[1], pads[3], dil[1], ceil_mode)
    return [TensorSpec((x.shape[0], x.shape[1], h, w), x.dtype)]


register(OpDef("max_pool2d", OpKind.ATOMIC, _pool_rule, 1, 1,
               doc="windowed max (kernel, stride, padding, dilation, ceil_mode); padding never wins"))
register(OpDef("avg_pool2d", OpKind.ATOMIC, _pool_rule, 1, 1,
               doc="windowed mean (attr count_include_pad); a reduction over a window that raster cannot "
                   "express without materialising every window"))


def _gather_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    data, idx = ins
    if idx.dtype not in (DType.int32, DType.int64):
        raise ValueError(f"gather indices must be int32 or int64, got {idx.dtype.value}")
    axis = norm_axis(int(attrs.get("axis", 0)), data.rank)
    return [TensorSpec((*data.shape[:axis], *idx.shape, *data.shape[axis + 1:]), data.dtype)]


register(OpDef("gather", OpKind.ATOMIC, _gather_rule, 2, 2,
               doc="take slices along axis by a runtime index tensor (negative indices wrap once); "
                   "embeddings, data-dependent selection that raster's static regions cannot express; "
                   "attr padding_index: a row that takes no gradient (an embedding's padding)"))


def _scatter_add_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    data, idx, updates = ins
    if idx.dtype not in (DType.int32, DType.int64):
        raise ValueError(f"scatter_add indices must be int32 or int64, got {idx.dtype.value}")
    if data.dtype is DType.bool or data.dtype.is_narrow or data.dtype is DType.string:
        raise ValueError(f"scatter_add adds: data must be a numeric type, got {data.dtype.value}")
    same_dtype([data, updates], "scatter_add")
    if data.rank == 0:
        raise ValueError("scatter_add into a 0-d tensor")
    axis = norm_axis(int(attrs.get("axis", 0)), data.rank)
    taken = (*data.shape[:axis], *idx.shape, *data.shape[axis + 1:])
    if tuple(updates.shape) != taken:
        raise ValueError(f"scatter_add updates must have gather's output shape {list(taken)} (data {data}, "
                         f"indices {idx}, axis {axis}), got {updates}")
    return [data]


register(OpDef("scatter_add", OpKind.ATOMIC, _scatter_add_rule, 3, 3,
               doc="data plus updates summed into the slices along axis that a runtime index tensor names "
                   "(negative indices wrap once; repeated indices accumulate, in index order): gather's "
                   "transpose, an embedding's gradient, torch index_add/scatter_add, ONNX Scatter* reduction add"))
