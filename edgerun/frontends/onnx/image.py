"""ImageDecoder: encoded image bytes to a uint8 [H, W, C] image, decoded by Pillow as ONNX's reference does.

It becomes image_decode (ir/ops/image_ops.py), a data-dependent op whose height and width are two fresh
symbols (the bytes say how big the image is); the program runs in stages split at it (ir/staging.py) and
the node runs on the reference kernel (oracle/image_kernels.py), which needs the optional Pillow package.
"""

from __future__ import annotations

from edgerun.frontends.onnx.context import ImportContext, OnnxNode, Out
from edgerun.frontends.onnx.data_dependent import extent_symbol
from edgerun.frontends.onnx.registry import onnx_op
from edgerun.frontends.onnx.strings import decoded
from edgerun.ir.dtypes import DType
from edgerun.ir.ops.image_ops import PIXEL_FORMATS

# The largest height or width a decoded image may have: the extent symbols' upper bound. JPEG's own limit
# (65535); a larger PNG or TIFF is refused at run time, naming the symbol, by the bounds check.
MAX_IMAGE_SIDE = (1 << 16) - 1


@onnx_op("ImageDecoder")
def image_decoder(ctx: ImportContext, node: OnnxNode) -> list[Out]:
    data = ctx.input(node, 0)
    if ctx.b.dtype(data) is not DType.uint8 or len(ctx.b.shape(data)) != 1:
        raise node.refuse(f"encoded_stream must be a 1-D uint8 tensor, got {ctx.b.dtype(data).value} "
                          f"{tuple(ctx.b.shape(data))}")
    fmt = decoded(node.attr("pixel_format", "RGB"))
    if fmt not in PIXEL_FORMATS:
        raise node.refuse(f"pixel_format {fmt!r} (ONNX defines {', '.join(PIXEL_FORMATS)})")
    height = extent_symbol(ctx, node, "height", MAX_IMAGE_SIDE)
    width = extent_symbol(ctx, node, "width", MAX_IMAGE_SIDE)
    return [ctx.emit("image_decode", [data], extent=[height, width], pixel_format=fmt)]
