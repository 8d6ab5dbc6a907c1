"""The quantized IR ops as ONNX Runtime's integer ops, claimed only where ORT computes them exactly.

quantize_linear / dequantize_linear -> QuantizeLinear / DequantizeLinear (per tensor or one axis);
dynamic_quantize (uint8, per tensor) -> DynamicQuantizeLinear; matmul_integer -> MatMulInteger;
conv_integer -> ConvInteger (per-tensor weight zero point: ORT refuses per-channel); matmul_int4 ->
com.microsoft MatMulNBits (accuracy_level 4 for int8 activations). requantize is claimed in its float32 arithmetic only (ORT's; the exact one can be
a step away): alone it is Cast -> Mul -> QuantizeLinear(scale 1), and after conv_integer (+ an int32 bias
add) the three become one QLinearConv, ORT's fast integer convolution, with x_scale = y_scale = 1 and the
multiplier as w_scale, so ORT's x_scale * w_scale / y_scale is the multiplier itself, bit for bit. After
matmul_integer the same way one QLinearMatMul, or with an int32 bias add one com.microsoft QGemm (bias as C).

ORT's x86 AVX2 kernel for uint8 x int8 adds pairs of products into int16 with saturation (vpmaddubsw), so
uint8 x int8 is claimed only for constant weights within [-64, 64] (7-bit weights: `reduce_range=True` in
edgerun.quantize), where no pair can saturate; uint8 x uint8 and int8 x int8 are always exact.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from edgerun.backends.base import OpSupport
from edgerun.backends.onnxruntime.onnx_ops import OnnxBuilder, Translator
from edgerun.ir.dtypes import DType
from edgerun.ir.graph import Graph, Node
from edgerun.ir.ops.atomic import conv_geometry, pool_geometry
from edgerun.oracle.quant_kernels import pack_int4

QUANT_TRANSLATORS: dict[str, Translator] = {}
QUANT_SUPPORTED: dict[str, OpSupport] = {}
MS_DOMAIN = "com.microsoft"
_PAIR_SAFE = 64  # |w| <= 64: 255 * (64 + 64) < 2^15, so ORT's int16 pair sums cannot saturate


def _claim(name: str, check: Callable[[Node, Graph], bool]) -> Callable[[Translator], Translator]:
    def deco(fn: Translator) -> Translator:
        QUANT_TRANSLATORS[name] = fn
        QUANT_SUPPORTED[name] = OpSupport(dtypes=None, check=check)
        return fn
    return deco


def _axis_of(shape: tuple[int, ...], rank: int) -> int | bool | None:
    """None for one value; the axis of x for a parameter varying along one axis; False otherwise."""
    if int(np.prod(shape)) == 1:
        return None
    varying = [i for i, d in enumerate(shape) if d != 1]
    return rank - len(shape) + varying[0] if len(varying) == 1 else False


def _qdq_ok(node: Node, graph: Graph) -> bool:
    x, scale, zp = (graph.specs[v] for v in node.inputs)
    axes = {_axis_of(scale.shape, x.rank), _axis_of(zp.shape, x.rank)} - {None}
    if False in axes or len(axes) > 1:
        return False
    if x.dtype is DType.int32:  # ONNX's int32 DequantizeLinear has no zero point: it must be a constant 0
        c = graph.constants.get(node.inputs[2])
        return c is not None and not c.any()
    return True


def _param(b: OnnxBuilder, v: str, rank: int) -> tuple[str, int | None]:
    shape = b.graph.specs[v].shape
    axis = _axis_of(shape, rank)
    if axis is None:
        return (b.node("Reshape", [v, b.ints([])]) if shape else v), None
    return b.node("Reshape", [v, b.ints([-1])]), int(axis)


def _qdq(op_type: str) -> Translator:
    def run(b: OnnxBuilder, node: Node) -> None:
        x, scale, zp = node.inputs
        rank = b.graph.specs[x].rank
        s, axis_s = _param(b, scale, rank)
        z, axis_z = _param(b, zp, rank)
        axis = axis_s if axis_s is not None else axis_z
        if axis is not None and axis_s is None:  # one scale, per-axis zero points: give the scale the axis too
            s = b.node("Expand", [s, b.ints([b.graph.specs[x].shape[axis]])])
        if axis is not None and axis_z is None:
            z = b.node("Expand", [z, b.ints([b.graph.specs[x].shape[axis]])])
        ins = [x, s] if b.graph.specs[x].dtype is DType.int32 else [x, s, z]
        b.node(op_type, ins, list(node.outputs), **({"axis": axis} if axis is not None else {}))
    return run


_quantize = _qdq("QuantizeLinear")


@_claim("quantize_linear", _qdq_ok)
def _quantize_or_pool_codes(b: OnnxBuilder, node: Node) -> None:
    """QuantizeLinear; or, for quantize(max_pool(dequantize(q, s, zp)), s, zp) with the same constant per-tensor
    scale and zero point (int8-static's max pool between integer layers), a MaxPool of the codes q: the same
    values, since dequantization is increasing and quantizing a dequantized code gives it back. The float
    DequantizeLinear and MaxPool emitted on the way are dropped when nothing else reads them."""
    codes = _pooled_codes(b, node)
    if codes is None:
        _quantize(b, node)
        return
    q, pool = codes
    kernel, stride, pads, dil, ceil_mode = pool_geometry(pool.attrs)
    b.node("MaxPool", [q], list(node.outputs), kernel_shape=list(kernel), strides=list(stride), pads=list(pads),
           dilations=list(dil), ceil_mode=int(ceil_mode))


def _pooled_codes(b: OnnxBuilder, node: Node) -> tuple[str, Node] | None:
    """(q, the max_pool2d node) when `node` quantizes max_pool2d(dequantize_linear(q, s, zp)) with the
    dequantize's own constant per-tensor s and zp (equal values)."""
    producers = b.producers
    pool = producers.get(node.inputs[0])
    dq = producers.get(pool.inputs[0]) if pool is not None and pool.op == "max_pool2d" else None
    if pool is None or dq is None or dq.op != "dequantize_linear":
        return None
    consts = b.graph.constants
    names = (*dq.inputs[1:], *node.inputs[1:])
    if not all(v in consts and consts[v].size == 1 for v in names):
        return None
    s_in, zp_in, s_out, zp_out = (consts[v] for v in names)
    same = s_in.dtype == s_out.dtype and zp_in.dtype == zp_out.dtype and s_in.reshape(()) == s_out.reshape(()) \
        and zp_in.reshape(()) == zp_out.reshape(())
    return (dq.inputs[0], pool) if bool(same) and float(s_in.reshape(())) > 0 else None


_dequantize = _qdq("DequantizeLinear")


@_claim("dequantize_linear", _qdq_ok)
def _dequantize_or_scale(b: OnnxBuilder, node: Node) -> None:
    """DequantizeLinear; or, where it dequantizes matmul_integer's accumulator with mul(input scale, constant
    weight scale) (int8-dynamic's linear layer), Mul(Cast(acc), scale): the same arithmetic (float32(acc) * scale,
    one rounding each), spelled as ONNX Runtime's own quantize_dynamic models spell it, so its graph optimizer
    fuses MatMulInteger + Cast + Mul (+ the bias Add after it) into MatMulIntegerToFloat, and that with the
    DynamicQuantizeLinear before it into DynamicQuantizeMatMul (tests/quant/test_quant_dynamic_linear.py)."""
    if not _matmul_scale(b, node):
        _dequantize(b, node)
        return
    acc, scale, _ = node.inputs
    b.node("Mul", [b.node("Cast", [acc], to=1), scale], list(node.outputs))


def _matmul_scale(b: OnnxBuilder, node: Node) -> bool:
    """Whether `node` is dequantize_linear(matmul_integer(a, w, a_zp, w_zp), mul(a_scale, w_scale), 0) with a
    uint8 input quantized per tensor, a constant 2-D int8 weight with one zero point, and a constant weight
    scale with one value or one per column: the form MatMulIntegerToFloat takes (A_Scale first)."""
    producers = b.producers
    acc, scale, zp = node.inputs
    matmul, mul = producers.get(acc), producers.get(scale)
    zero = b.graph.constants.get(zp)
    if matmul is None or matmul.op != "matmul_integer" or mul is None or mul.op != "mul" or len(mul.inputs) != 2 \
            or zero is None or zero.any():
        return False
    a, w, a_zp, w_zp = matmul.inputs
    a_scale, w_scale = mul.inputs
    specs = b.graph.specs
    n = specs[w].shape[-1]
    return ({w, w_zp, w_scale} <= set(b.graph.constants) and a_scale not in b.graph.constants and specs[w].rank == 2
            and specs[a].dtype is DType.uint8 and specs[w].dtype is DType.int8 and specs[a_zp].numel == 1
            and specs[w_zp].numel == 1 and specs[a_scale].numel == 1 and specs[a_scale].dtype is DType.float32
            and specs[w_scale].dtype is DType.float32 and specs[w_scale].shape in ((), (1,), (n,), (1, n)))


def _dynamic_ok(node: Node, graph: Graph) -> bool:
    return node.attrs.get("dtype", "uint8") == "uint8" and not node.attrs.get("per_token")


@_claim("dynamic_quantize", _dynamic_ok)
def _dynamic(b: OnnxBuilder, node: Node) -> None:
    b.node("DynamicQuantizeLinear", [node.inputs[0]], list(node.outputs))


def _exact_integer_product(node: Node, graph: Graph) -> bool:
    a, w = graph.specs[node.inputs[0]].dtype, graph.specs[node.inputs[1]].dtype
    if a is w:
        return True
    weight = graph.constants.get(node.inputs[1])
    return a is DType.uint8 and weight is not None and int(np.abs(weight.astype(np.int32)).max(initial=0)) <= _PAIR_SAFE


def _matmul_ok(node: Node, graph: Graph) -> bool:
    a_zp = graph.specs[node.inputs[2]]
    a = graph.specs[node.inputs[0]]
    row_zp = a_zp.numel == 1 or (a_zp.rank == 2 and a_zp.shape == (a.shape[-2], 1))
    return row_zp and graph.specs[node.inputs[3]].rank <= 1 and _exact_integer_product(node, graph)


@_claim("matmul_integer", _matmul_ok)
def _matmul_integer(b: OnnxBuilder, node: Node) -> None:
    a, w, a_zp, w_zp = node.inputs
    if b.graph.specs[a_zp].numel == 1 and b.graph.specs[a_zp].shape:
        a_zp = b.node("Reshape", [a_zp, b.ints([])])
    elif b.graph.specs[a_zp].rank == 2:
        a_zp = b.node("Reshape", [a_zp, b.ints([-1])])
    b.node("MatMulInteger", [a, w, a_zp, w_zp], list(node.outputs))


def _conv_ok(node: Node, graph: Graph) -> bool:
    return graph.specs[node.inputs[3]].numel == 1 and _exact_integer_product(node, graph)


@_claim("conv_integer", _conv_ok)
def _conv_integer(b: OnnxBuilder, node: Node) -> None:
    stride, pads, dil, groups = conv_geometry(node.attrs)
    x, w, x_zp, w_zp = node.inputs
    w_zp = b.node("Reshape", [w_zp, b.ints([])]) if b.graph.specs[w_zp].shape else w_zp
    shape = b.graph.specs[w].shape
    b.node("ConvInteger", [x, w, x_zp, w_zp], list(node.outputs), kernel_shape=[shape[2], shape[3]],
           strides=list(stride), pads=list(pads), dilations=list(dil), group=groups)


def _int4_ok(node: Node, graph: Graph) -> bool:
    # MatMulNBits wants its scales and zero points as initializers in its own layout: constants only.
    return all(v in graph.constants for v in node.inputs[1:] if v)


@_claim("matmul_int4", _int4_ok)
def _matmul_int4(b: OnnxBuilder, node: Node) -> None:
    n, blocks, _ = b.graph.specs[node.inputs[1]].shape
    ins = [node.inputs[0], node.inputs[1], b.const(b.graph.constants[node.inputs[2]].reshape(-1), "scales")]
    if len(node.inputs) > 3 and node.inputs[3]:
        zp = b.graph.constants[node.inputs[3]]
        if zp.dtype == np.uint8:  # two per byte, each row padded to whole bytes
            zp = pack_int4(np.pad(zp, ((0, 0), (0, blocks % 2))))
        ins.append(b.const(np.ascontiguousarray(zp.reshape(-1)), "zero_points"))
    # accuracy_level 4: MLAS rounds the input to int8 per block first, which is what activations="int8" says.
    int8 = node.attrs.get("activations", "float") == "int8"
    b.node("MatMulNBits", ins, list(node.outputs), domain=MS_DOMAIN, K=int(node.attrs["k"]), N=n, bits=4,
           block_size=int(node.attrs["group_size"]), **({"accuracy_level": 4} if int8 else {}))


def _requantize_ok(node: Node, graph: Graph) -> bool:
    # The multiplier must be a constant with one value or one per channel (axis 1): QLinearConv's w_scale.
    return node.attrs.get("arithmetic", "exact") == "float32" and node.inputs[1] in graph.constants \
        and graph.specs[node.inputs[2]].numel == 1


def _fusable_conv(b: OnnxBuilder, node: Node) -> tuple[Node, str] | None:
    """(conv_integer node, int32 bias constant or "") when `node` requantizes conv_integer [+ constant bias]."""
    producers = b.producers
    src, bias = producers.get(node.inputs[0]), ""
    if src is not None and src.op == "add":
        acc, bias = src.inputs
        if acc not in producers or bias not in b.graph.constants:
            acc, bias = bias, acc
        if bias not in b.graph.constants or b.graph.constants[bias].dtype != np.int32:
            return None
        src = producers.get(acc)
    if src is None or src.op != "conv_integer" or src.inputs[1] not in b.graph.constants:
        return None
    oc = b.graph.specs[src.inputs[1]].shape[0]
    per_channel = ((oc, 1, 1), (1, oc, 1, 1))  # along NCHW's channel axis (a bare (oc,) would broadcast on W)
    if bias and b.graph.specs[bias].shape not in per_channel:
        return None
    scale = b.graph.constants[node.inputs[1]]
    if scale.size != 1 and scale.shape not in per_channel:
        return None
    return src, bias


def _fusable_matmul(b: OnnxBuilder, node: Node) -> tuple[Node, str] | None:
    """(matmul_integer node, int32 bias constant or "") when `node` requantizes matmul_integer [+ a constant
    bias along the columns]: a constant 2-D weight with a constant per-tensor zero point, a per-tensor input
    zero point, a multiplier with one value or one per column, uint8 in and out (what ORT's QLinearMatMul and
    QGemm take at opset 20)."""
    producers = b.producers
    src, bias = producers.get(node.inputs[0]), ""
    if src is not None and src.op == "add":
        acc, bias = src.inputs
        if bias not in b.graph.constants:
            acc, bias = bias, acc
        if bias not in b.graph.constants or b.graph.constants[bias].dtype != np.int32:
            return None
        src = producers.get(acc)
    if src is None or src.op != "matmul_integer" or not {src.inputs[1], src.inputs[3]} <= set(b.graph.constants):
        return None
    x, w, x_zp, w_zp = (b.graph.specs[v] for v in src.inputs)
    if w.rank != 2 or x_zp.numel != 1 or w_zp.numel != 1 or x.dtype is not DType.uint8 \
            or b.graph.specs[node.outputs[0]].dtype is not DType.uint8:
        return None
    per_column = ((w.shape[1],), (1, w.shape[1]))
    if bias and (b.graph.specs[bias].shape not in per_column or not all(isinstance(d, int) for d in x.shape)):
        return None  # (QGemm's 2-D input is reshaped to and from fixed shapes)
    scale = b.graph.specs[node.inputs[1]]
    return (src, bias) if scale.numel == 1 or scale.shape in per_column else None


def _scalar(b: OnnxBuilder, v: str) -> str:
    return b.node("Reshape", [v, b.ints([])]) if b.graph.specs[v].shape else v


def _qlinear_matmul(b: OnnxBuilder, node: Node, matmul: Node, bias: str, one: str) -> None:
    """a_scale = y_scale = 1 and b_scale = the multiplier, as for QLinearConv. Without a bias one QLinearMatMul;
    with one com.microsoft QGemm (QLinearMatMul has no bias input), whose A is 2-D: the rows flattened and
    restored around it."""
    x, w, x_zp, w_zp = matmul.inputs
    value = b.graph.constants[node.inputs[1]]
    b_scale = b.const(np.ascontiguousarray(value.reshape(-1) if value.size > 1 else value.reshape(())), "multiplier")
    y_zp = _scalar(b, node.inputs[2])
    if not bias:
        b.node("QLinearMatMul", [x, one, _scalar(b, x_zp), w, b_scale, _scalar(b, w_zp), one, y_zp],
               list(node.outputs))
        return
    k, n = b.graph.specs[w].shape
    zp = b.graph.constants[w_zp].reshape(())
    b_zp = b.const(np.full(n, zp) if value.size > 1 else zp, "b_zero_point")  # QGemm: one per b_scale
    c = b.const(np.ascontiguousarray(b.graph.constants[bias].reshape(-1)), "bias")
    x_shape = b.graph.specs[x].shape
    a = x if len(x_shape) == 2 else b.node("Reshape", [x, b.ints([-1, k])])
    ins = [a, one, _scalar(b, x_zp), w, b_scale, b_zp, c, one, y_zp]
    if len(x_shape) == 2:
        b.node("QGemm", ins, list(node.outputs), domain=MS_DOMAIN)
        return
    y = b.node("QGemm", ins, domain=MS_DOMAIN)
    b.node("Reshape", [y, b.ints(list(b.graph.specs[node.outputs[0]].shape))], list(node.outputs))


@_claim("requantize", _requantize_ok)
def _requantize(b: OnnxBuilder, node: Node) -> None:
    acc, scale, zp = node.inputs
    zp_name = _scalar(b, zp)
    one = b.const(np.array(1.0, np.float32), "one")
    matmul = _fusable_matmul(b, node)
    if matmul is not None:
        _qlinear_matmul(b, node, *matmul, one)
        return
    fused = _fusable_conv(b, node)
    if fused is None:
        x = b.node("Mul", [b.node("Cast", [acc], to=1), scale])  # float32(acc) * scale: one rounding each
        b.node("QuantizeLinear", [x, one, zp_name], list(node.outputs))
        return
    conv, bias = fused
    stride, pads, dil, groups = conv_geometry(conv.attrs)
    x, w, x_zp, w_zp = conv.inputs
    w_shape = b.graph.specs[w].shape
    multiplier = b.const(np.ascontiguousarray(b.graph.constants[scale].reshape(-1)), "multiplier")
    w_zp_spec = b.graph.specs[w_zp]
    w_zp_name = w_zp if not w_zp_spec.shape else b.node("Reshape", [w_zp, b.ints([] if w_zp_spec.numel == 1 else [-1])])
    ins = [x, one, _scalar(b, x_zp), w, multiplier, w_zp_name, one, zp_name]
    if bias:
        ins.append(b.const(np.ascontiguousarray(b.graph.constants[bias].reshape(-1)), "bias"))
    b.node("QLinearConv", ins, list(node.outputs), kernel_shape=[w_shape[2], w_shape[3]], strides=list(stride),
           pads=list(pads), dilations=list(dil), group=groups)


def _x86_fma_cpu() -> bool:
    """Whether this CPU runs MLAS's AVX2 QLinearAdd (x86 with AVX2 and FMA), the arithmetic quantized_add
    spells out; elsewhere (NEON's fixed point, SSE2 without fma) ORT computes something else."""
    import importlib

    for module in ("numpy._core._multiarray_umath", "numpy.core._multiarray_umath"):  # numpy 2, numpy 1.26
        try:
            features = importlib.import_module(module).__cpu_features__
        except (ImportError, AttributeError):
            continue
        return bool(features.get("AVX2")) and bool(features.get("FMA3"))
    return False


X86_FMA = _x86_fma_cpu()
_MAX_ADD_RATIO = 2.0 ** 20  # 255 * 2^20 * 2 < 2^31: no float reaches cvtps2dq's out-of-range value


def _quantized_add_ok(node: Node, graph: Graph) -> bool:
    """Constant per-tensor parameters with finite, moderate scale ratios, uint8/int8 data, on an x86 FMA CPU."""
    params = node.inputs[1:3] + node.inputs[4:8]
    if not X86_FMA or not all(v in graph.constants for v in params):
        return False
    a_scale, b_scale, y_scale = (float(graph.constants[node.inputs[i]].reshape(())) for i in (1, 4, 6))
    if not all(np.isfinite(s) and s > 0 for s in (a_scale, b_scale, y_scale)):
        return False
    return max(a_scale, b_scale) / y_scale < _MAX_ADD_RATIO


@_claim("quantized_add", _quantized_add_ok)
def _quantized_add(b: OnnxBuilder, node: Node) -> None:
    ins = [v if i in (0, 3) else _scalar(b, v) for i, v in enumerate(node.inputs)]
    b.node("QLinearAdd", ins, list(node.outputs), domain=MS_DOMAIN)
