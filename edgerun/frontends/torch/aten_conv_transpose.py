"""Transposed convolution (aten.convolution with transposed=True): ConvTranspose1d/2d/3d, every U-Net decoder.

1-D runs as 2-D over a height of one. 2-D is the IR's `conv_transpose2d` composite (one ConvTranspose
kernel where an engine has one). 3-D has no IR op: it is a sum over the kernel's depth taps of 2-D transposed
convolutions with the depth folded into the batch, each tap's result spread along the output depth
(`stride - 1` zeros between input planes, shifted by the tap's dilated offset), then cropped by the padding.

torch's padding is symmetric per axis (`padding` cropped from each side of the full output) and
`output_padding` extends the end; the weight is [Cin, Cout/groups, *kernel] as the IR's op takes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from edgerun.frontends.torch.context import ConvertContext


def transposed_convolution(ctx: ConvertContext, node: Any, a: dict[str, Any], x: str, w: str, bias: str) -> str:
    rank = len(ctx.b.shape(w))
    spatial = rank - 2
    if spatial not in (1, 2, 3):
        ctx.unsupported(f"{spatial}-D transposed convolution")
    geometry = {k: _per_axis(a[k], spatial) for k in ("stride", "padding", "dilation", "output_padding")}
    groups = int(a["groups"])
    b = ctx.b
    unbatched = len(b.shape(x)) == rank - 1
    if unbatched:
        x = b.emit("reshape", [x], shape=[1, *b.shape(x)])
    if spatial == 3:
        y = _conv_transpose3d(ctx, x, w, bias, geometry, groups)
    elif spatial == 2:
        y = _conv_transpose2d(ctx, x, w, bias, geometry, groups)
    else:
        n, c, length = b.shape(x)
        x2 = b.emit("reshape", [x], shape=[n, c, 1, length])
        w2 = b.emit("reshape", [w], shape=[*b.shape(w)[:2], 1, b.shape(w)[2]])
        lifted = {k: [1 if k in ("stride", "dilation") else 0, *v] for k, v in geometry.items()}
        y = _conv_transpose2d(ctx, x2, w2, bias, lifted, groups)
    return b.emit("reshape", [y], shape=list(ctx.out_shape(node)))


def _conv_transpose2d(ctx: ConvertContext, x: str, w: str, bias: str, g: dict[str, list[int]],
                      groups: int) -> str:
    ph, pw = g["padding"]
    return ctx.b.emit("conv_transpose2d", [x, w, bias] if bias else [x, w], stride=g["stride"],
                      dilation=g["dilation"], padding=[ph, pw, ph, pw], output_padding=g["output_padding"],
                      groups=groups)


def _conv_transpose3d(ctx: ConvertContext, x: str, w: str, bias: str, g: dict[str, list[int]],
                      groups: int) -> str:
    b = ctx.b
    n, cin, depth, h, wd = b.shape(x)
    kd = b.shape(w)[2]
    sd, pd, dd, opd = (g[k][0] for k in ("stride", "padding", "dilation", "output_padding"))
    if not all(isinstance(d, int) for d in (n, depth)):
        ctx.unsupported("3-D transposed convolution with a symbolic batch or depth")
    planes = b.emit("reshape", [b.emit("transpose", [x], perm=[0, 2, 1, 3, 4])], shape=[n * depth, cin, h, wd])
    plane_geometry = {k: v[1:] for k, v in g.items()}
    full = (depth - 1) * sd + (kd - 1) * dd + 1  # the output depth before padding crops it
    total = ""
    for tap in range(kd):
        wt = b.emit("reshape", [b.emit("slice", [w], starts=[tap], ends=[tap + 1], axes=[2])],
                    shape=[b.shape(w)[0], b.shape(w)[1], *b.shape(w)[3:]])
        t = _conv_transpose2d(ctx, planes, wt, "", plane_geometry, groups)
        _, cout, oh, ow = b.shape(t)
        t = b.emit("reshape", [t], shape=[n, depth, 1, cout * oh * ow])
        if sd > 1:  # stride - 1 zero planes after each input plane, the trailing ones dropped
            zeros = b.const(np.zeros((n, depth, sd - 1, cout * oh * ow)), b.dtype(t))
            t = b.emit("concat", [t, zeros], axis=2)
            t = b.emit("slice", [b.emit("reshape", [t], shape=[n, depth * sd, cout * oh * ow])],
                       starts=[0], ends=[(depth - 1) * sd + 1], axes=[1])
        else:
            t = b.emit("reshape", [t], shape=[n, depth, cout * oh * ow])
        t = b.emit("pad", [t], pads=[[0, 0], [tap * dd, (kd - 1 - tap) * dd], [0, 0]], mode="constant", value=0.0)
        total = t if not total else b.binary("add", total, t)
    # Crop the padding from each side; output_padding extends the end (with zeros, then the bias).
    cropped = b.emit("pad", [total], pads=[[0, 0], [-pd, opd - pd], [0, 0]], mode="constant", value=0.0)
    out_depth = full - 2 * pd + opd
    y = b.emit("transpose", [b.emit("reshape", [cropped], shape=[n, out_depth, cout, oh, ow])], perm=[0, 2, 1, 3, 4])
    if bias:
        y = b.binary("add", y, b.emit("reshape", [bias], shape=[cout, 1, 1, 1]))
    return y


def _per_axis(v: Any, n: int) -> list[int]:
    values = [int(x) for x in (v if isinstance(v, list | tuple) else [v])]
    return values * n if len(values) == 1 else values
