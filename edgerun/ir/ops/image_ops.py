"""image_decode: encoded image bytes (JPEG, PNG, BMP, TIFF, WebP, ...) to a uint8 [H, W, C] image.

Its height and width are in the bytes, so it is a data-dependent op (ops/data_dependent_ops.py) with two
run-time sizes: attr `extent` names both symbols, [height, width], and the program runs in stages split at
the node (ir/staging.py). C follows attr pixel_format: 3 for RGB and BGR, 1 for Grayscale. Only the reference
runs it (oracle/image_kernels.py, with Pillow, as ONNX's reference does); no backend declares a kernel.
"""

from __future__ import annotations

from typing import Any

from edgerun.ir.dtypes import DType
from edgerun.ir.registry import OpDef, OpKind, register, register_no_gradient
from edgerun.ir.symbolic import sym
from edgerun.ir.tensor_spec import TensorSpec

Attrs = dict[str, Any]
PIXEL_FORMATS = {"RGB": 3, "BGR": 3, "Grayscale": 1}


def _image_decode_rule(ins: list[TensorSpec], attrs: Attrs) -> list[TensorSpec]:
    data = ins[0]
    if data.dtype is not DType.uint8 or data.rank != 1:
        raise ValueError(f"image_decode takes the encoded bytes as a 1-D uint8 tensor, got {data}")
    fmt = attrs.get("pixel_format", "RGB")
    if fmt not in PIXEL_FORMATS:
        raise ValueError(f"image_decode pixel_format must be one of {sorted(PIXEL_FORMATS)}, got {fmt!r}")
    names = attrs.get("extent")
    if not isinstance(names, list) or len(names) != 2 or not all(isinstance(n, str) and n.isidentifier()
                                                                 for n in names):
        raise ValueError(f"image_decode needs attr 'extent' naming its [height, width] symbols, got {names!r}")
    return [TensorSpec((sym(names[0]), sym(names[1]), PIXEL_FORMATS[fmt]), DType.uint8)]


register(OpDef("image_decode", OpKind.DATA_DEPENDENT, _image_decode_rule, 1, 1,
               doc="encoded image bytes (uint8 [N]) decoded to uint8 [H, W, C] in attr pixel_format (RGB, BGR: "
                   "C = 3; Grayscale: C = 1), H and W the symbols attr extent names: ONNX ImageDecoder, decoded "
                   "by Pillow as ONNX's reference does"))
register_no_gradient(["image_decode"],
                     "decodes bytes to integer pixels")
