"""Read a GGUF file (llama.cpp's model format) with the `gguf` package: metadata and tensors.

Tensors come back as float32 arrays (F32, F16, BF16) or PackedWeight, never dequantized here: Q4_0, Q4_1
and Q8_0 as codes with per-32 scales, and the formats common in downloaded GGUFs in those group-wise forms
(quant_blocks.py: Q4_K as q4_1; Q5_0, Q5_1 and Q5_K as q5_1, codes 0..31; Q6_K as q6_k, int8 codes with a
scale per 16). BF16 is widened to float32 with gguf's own converter. Any other tensor type, a file that is
not GGUF, or a truncated one is an EdgerunError naming the file and what is wrong.
"""

from __future__ import annotations

import functools
import gc
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError
from edgerun.llm.quant_blocks import (
    PackedWeight,
    unpack_blocks,
    unpack_q4_k,
    unpack_q5,
    unpack_q5_k,
    unpack_q6_k,
)

GGUF_MAGIC = b"GGUF"
Tensor = np.ndarray | PackedWeight

# gguf's type names -> the function reading its blocks into a PackedWeight
_PACKED: dict[str, Callable[[np.ndarray, tuple[int, int]], PackedWeight]] = {
    **{t: functools.partial(unpack_blocks, t.lower()) for t in ("Q4_0", "Q4_1", "Q8_0")},
    **{t: functools.partial(unpack_q5, t.lower()) for t in ("Q5_0", "Q5_1")},
    "Q4_K": unpack_q4_k, "Q5_K": unpack_q5_k, "Q6_K": unpack_q6_k}
_FLOAT = {"F32", "F16"}
_DEQUANTIZED_AT_LOAD = {"BF16"}
SUPPORTED_TYPES = sorted(_FLOAT | set(_PACKED) | _DEQUANTIZED_AT_LOAD)
_COLLECT_AFTER_PARTS = 10_000  # parsed field parts above which the reader collects garbage after freeing them


@dataclass
class GGUFContents:
    path: str
    metadata: dict[str, Any]
    tensors: dict[str, Tensor] = field(repr=False)
    tensor_types: dict[str, str] = field(repr=False)  # name -> GGUF type name (F32, Q4_1, ...)


def read_gguf(path: str | os.PathLike[str]) -> GGUFContents:
    path = os.fspath(path)
    reader = _open(path)
    metadata = _metadata(path, reader)
    tensors: dict[str, Tensor] = {}
    types: dict[str, str] = {}
    for t in reader.tensors:
        type_name = t.tensor_type.name
        types[t.name] = type_name
        # GGUF lists dimensions fastest-first; numpy's row-major shape is the reverse.
        shape = tuple(int(d) for d in reversed([int(x) for x in t.shape]))
        try:
            tensors[t.name] = _tensor(type_name, t.data, shape)
        except EdgerunError as exc:
            raise EdgerunError(f"{path!r}: tensor {t.name!r}: {exc}") from None
        except Exception as exc:
            raise EdgerunError(f"{path!r}: tensor {t.name!r} is damaged or truncated: {exc}") from None
    return GGUFContents(path, metadata, tensors, types)


def _open(path: str) -> Any:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise EdgerunError(f"cannot read {path!r}: {exc.strerror or exc}") from None
    if magic != GGUF_MAGIC:
        raise EdgerunError(f"{path!r} is not a GGUF file (starts with {magic!r}, expected {GGUF_MAGIC!r})")
    try:
        return _plain_array_reader()(path, "r")
    except Exception as exc:  # the gguf package raises ValueError/IndexError/struct errors on bad bytes
        raise EdgerunError(f"{path!r} is a damaged or truncated GGUF file: {type(exc).__name__}: {exc}") from None


def _metadata(path: str, reader: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {}
    for key, fld in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            metadata[key] = fld.contents()
        except Exception as exc:
            raise EdgerunError(f"{path!r}: cannot decode metadata {key!r}: {exc}") from None
    # A model's parsed fields are ~250,000 small arrays (the vocabulary and merges, ~100 MB of objects):
    # freed before the tensors are unpacked, so the two never count together in the peak memory of a load.
    # The full collection (about 30 ms in a process holding many objects) only pays off for such a file,
    # not for each of a small file's few fields.
    parts = sum(len(fld.parts) for fld in reader.fields.values())
    reader.fields.clear()
    if parts > _COLLECT_AFTER_PARTS:
        gc.collect()
    return metadata


@functools.cache
def _plain_array_reader() -> type:
    """gguf's GGUFReader parsing a plain ndarray view of its memory map instead of the np.memmap itself.

    Same parsing and the same mapped bytes, without np.memmap's subclass overhead on each of the ~250,000
    small slices a 50k-entry vocabulary and merge list take: reading SmolLM2's file drops from about 7.5 s
    to 2.4 s (measured on the busy project machine).
    """
    import gguf

    class PlainArrayReader(gguf.GGUFReader):
        @property  # type: ignore[override]
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, value: np.ndarray) -> None:
            self._plain = value.view(np.ndarray)

        def _get(self, offset: int, dtype: Any, count: int = 1, override_order: Any = None) -> np.ndarray:
            # gguf hands back fewer values than asked for when the file ends first; an array field then
            # loops over its declared length (up to 2**64) appending empty reads, and a 200-byte file takes
            # all the memory there is (found by fuzz/targets.py::gguf). A short read is a truncated file.
            values = super()._get(offset, dtype, count, override_order)
            if len(values) < int(count):
                raise ValueError(f"{int(count)} values of {np.dtype(dtype).name} at byte {offset} "
                                 f"run past the end of the file ({len(self._plain)} bytes)")
            return values

    return PlainArrayReader


def _tensor(type_name: str, data: np.ndarray, shape: tuple[int, ...]) -> Tensor:
    if type_name in _FLOAT:
        arr = np.asarray(data)
        if arr.size != int(np.prod(shape)):
            raise EdgerunError(f"holds {arr.size} values, its shape {shape} needs {int(np.prod(shape))}")
        return arr.astype(np.float32).reshape(shape)
    if type_name in _DEQUANTIZED_AT_LOAD:
        import gguf

        values = gguf.quants.dequantize(np.asarray(data), gguf.GGMLQuantizationType[type_name])
        return np.asarray(values, np.float32).reshape(shape)
    unpack = _PACKED.get(type_name)
    if unpack is None:
        raise EdgerunError(f"tensor type {type_name} is not supported (supported: {', '.join(SUPPORTED_TYPES)})")
    if len(shape) != 2:
        raise EdgerunError(f"quantized tensors must be matrices, got shape {shape}")
    return unpack(np.asarray(data), (shape[0], shape[1]))


def file_digest(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    """sha256 of the file: the key of compiled programs cached for it."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
