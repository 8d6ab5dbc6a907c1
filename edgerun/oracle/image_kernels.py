"""The reference kernel of image_decode (ir/ops/image_ops.py): Pillow decodes, as ONNX's reference does.

Decoding is codec code (libjpeg, libpng, libwebp, libtiff, openjpeg), not numeric kernels, and JPEG decoders
differ in IDCT rounding, so matching ONNX's expected outputs means decoding with what produced them: Pillow.
It is an optional dependency, imported here only when a program decodes an image. The one place this departs
from ONNX's reference: RGB and BGR convert to 3-channel RGB first, so a grayscale or RGBA file gives the
[H, W, 3] the op declares (the reference would give [H, W] or [H, W, 4]); an RGB file decodes identically.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError


class ImageDecodeError(EdgerunError):
    """Bytes that are no image Pillow can decode, or Pillow itself missing."""


def _image_decode(args: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
    try:
        import PIL.Image  # only programs that decode images need Pillow (requirements.txt)
    except ImportError as e:
        raise ImageDecodeError("image_decode (ONNX ImageDecoder) needs the 'pillow' package: pip install pillow") \
            from e
    data = np.ascontiguousarray(args[0], dtype=np.uint8).tobytes()
    fmt = attrs.get("pixel_format", "RGB")
    try:
        with PIL.Image.open(io.BytesIO(data)) as img:
            pixels = np.array(img.convert("L" if fmt == "Grayscale" else "RGB"), dtype=np.uint8)
    except (OSError, ValueError, SyntaxError, PIL.Image.DecompressionBombError) as e:
        # Pillow raises UnidentifiedImageError (an OSError) for unknown bytes, OSError / SyntaxError /
        # ValueError for truncated or corrupt ones, depending on the codec.
        raise ImageDecodeError(f"image_decode: {len(data)} bytes are not an image Pillow can decode "
                               f"({type(e).__name__}: {e})") from e
    if fmt == "Grayscale":
        return [pixels[:, :, np.newaxis]]
    return [np.ascontiguousarray(pixels[:, :, ::-1]) if fmt == "BGR" else pixels]


IMAGE_DATA_DEPENDENT_KERNELS = {"image_decode": _image_decode}
