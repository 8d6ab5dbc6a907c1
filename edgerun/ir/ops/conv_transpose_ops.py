"""conv_transpose2d, a composite kept until placement: engines run it as one kernel (ONNX Runtime's
ConvTranspose), at a quarter of the work of its lowering for a stride-2 upsampling.

Lowered, a transposed convolution is zero insertion (one raster with a zero fill: `stride - 1` zeros between
neighbours), a pad or crop, and a plain conv2d with the kernel flipped and its in/out channels swapped per
group. The decomposition is the semantics.

inputs: x [N, Cin, H, W], weight [Cin, Cout/groups, kh, kw] (ONNX's and PyTorch's layout), optional bias
[Cout]. attrs: `stride`, `dilation` ([h, w]), `padding` ([top, left, bottom, right]: cropped from the full
output; negative values extend it), `output_padding` ([h, w]: added at the bottom/right), `groups`.
Output size per axis: (in - 1) * stride + (k - 1) * dilation + 1 - begin - end + output_padding.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerun.ir.builder import Builder, absent
from edgerun.ir.ops._rules import require_float, same_dtype
from edgerun.ir.ops.raster import strided_copy_regions
from edgerun.ir.registry import OpDef, OpKind, register
from edgerun.ir.symbolic import is_symbolic
from edgerun.ir.tensor_spec import TensorSpec

Attrs = dict[str, Any]


def _pair(attrs: Attrs, key: str, default: int) -> tuple[int, int]:
    v = attrs.get(key)
    if v is None:
        return default, default
    if len(v) != 2:
        raise ValueError(f"conv_transpose2d {key} needs 2 values, got {v}")
    return int(v[0]), int(v[1])


def transpose_geometry(attrs: Attrs) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int],
                                               tuple[int, int], int]:
    """(stride, dilation, padding, output_padding, groups) with defaults applied."""
    pads = attrs.get("padding") or [0, 0, 0, 0]
    if len(pads) != 4:
        raise ValueError(f"conv_transpose2d padding needs [top, left, bottom, right], got {pads}")
    return (_pair(attrs, "stride", 1), _pair(attrs, "dilation", 1), (int(pads[0]), int(pads[1]), int(pads[2]),
            int(pads[3])), _pair(attrs, "output_padding", 0), int(attrs.get("groups", 1)))


def _rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    x, w = ins[0], ins[1]
    dtype = same_dtype([x, w], "conv_transpose2d")
    require_float(x, "conv_transpose2d")
    if x.rank != 4 or w.rank != 4:
        raise ValueError(f"conv_transpose2d needs an NCHW input and a [Cin, Cout/g, kh, kw] weight, got {x} and {w}")
    stride, dil, pads, out_pad, groups = transpose_geometry(attrs)
    if groups < 1 or x.shape[1] != w.shape[0] or w.shape[0] % groups:
        raise ValueError(f"conv_transpose2d channels do not fit groups={groups}: input {x}, weight {w}")
    if min(stride) < 1 or min(dil) < 1 or min(out_pad) < 0:
        raise ValueError("conv_transpose2d stride and dilation must be >= 1 and output_padding >= 0")
    cout = w.shape[1] * groups
    if len(ins) == 3 and not absent(ins[2]) and (ins[2].shape != (cout,) or ins[2].dtype != dtype):
        raise ValueError(f"conv_transpose2d bias must be {dtype.value}[{cout}], got {ins[2]}")
    sizes = [(n - 1) * s + (k - 1) * d + 1 - b - e + op for n, s, k, d, b, e, op in
             zip(x.shape[2:], stride, w.shape[2:], dil, pads[:2], pads[2:], out_pad)]
    if any(not is_symbolic(s) and s < 1 for s in sizes):  # a symbolic size is checked once it is bound
        raise ValueError(f"conv_transpose2d output would be {sizes}")
    return [TensorSpec((x.shape[0], cout, sizes[0], sizes[1]), dtype)]


def _insert_zeros(b: Builder, x: str, stride: tuple[int, int]) -> str:
    """x [N, C, H, W] with stride - 1 zeros between neighbours along H and W."""
    n, c, h, w = b.shape(x)
    dh, dw = (h - 1) * stride[0] + 1, (w - 1) * stride[1] + 1
    if (dh, dw) == (h, w):
        return x
    regions = strided_copy_regions(0, 0, [c * h * w, h * w, w, 1], 0,
                                   [c * dh * dw, dh * dw, stride[0] * dw, stride[1]], [n, c, h, w])
    return b.emit("raster", [x], regions=regions, shape=[n, c, dh, dw], fill=0.0)


def _flipped_kernel(b: Builder, w: str, groups: int) -> str:
    """The weight [Cin, Cout/g, kh, kw] as the equivalent conv2d's [Cout, Cin/g, kh, kw]: flipped, in and out
    swapped per group. A constant weight is rearranged here; another gets the same as graph ops."""
    cin, cout_g, kh, kw = b.shape(w)
    cin_g = cin // groups
    if w in b.graph.constants:
        flipped = np.asarray(b.graph.constants[w])[:, :, ::-1, ::-1]
        flipped = flipped.reshape(groups, cin_g, cout_g, kh, kw).transpose(0, 2, 1, 3, 4)
        return b.const(np.ascontiguousarray(flipped.reshape(groups * cout_g, cin_g, kh, kw)), b.dtype(w),
                       hint="flipped_kernel")
    v = b.emit("slice", [w], starts=[-1, -1], ends=[-kh - 1, -kw - 1], axes=[2, 3], steps=[-1, -1])
    v = b.emit("reshape", [v], shape=[groups, cin_g, cout_g, kh, kw])
    v = b.emit("transpose", [v], perm=[0, 2, 1, 3, 4])
    return b.emit("reshape", [v], shape=[groups * cout_g, cin_g, kh, kw])


def _decompose(b: Builder, ins: list[str], attrs: Attrs) -> list[str]:
    x, w = ins[0], ins[1]
    stride, dil, pads, out_pad, groups = transpose_geometry(attrs)
    kh, kw = b.shape(w)[2:]
    spread = _insert_zeros(b, x, stride)
    pairs = [[0, 0], [0, 0]] + [[d * (k - 1) - p0, d * (k - 1) - p1 + op]
                                for k, d, p0, p1, op in zip((kh, kw), dil, pads[:2], pads[2:], out_pad)]
    padded = b.emit("pad", [spread], pads=pairs, mode="constant", value=0.0)
    bias = [ins[2]] if len(ins) > 2 and ins[2] else []
    return [b.emit("conv2d", [padded, _flipped_kernel(b, w, groups), *bias], dilation=list(dil), groups=groups)]


register(OpDef("conv_transpose2d", OpKind.COMPOSITE, _rule, 2, 3, decompose=_decompose,
               doc="transposed 2-D convolution (attrs stride, dilation, padding, output_padding, groups; "
                   "weight [Cin, Cout/g, kh, kw]); upsampling decoders"))
