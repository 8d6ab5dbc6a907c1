"""Converted partitions kept on disk, keyed by what was converted: a backend's build, paid once per content.

A backend that builds a partition by running a converter (MNN: the partition's ONNX through `mnnconvert`,
0.6-10 s for a zoo model) keeps the converter's output here and reads it back on the next load of the same
partition, by any program, in any process. The key hashes the emitted model (so an emitter change is a new
key), the weights it reads, and whatever else the converter's output depends on (the converter's version
and arguments, passed as `salt`). Files live under the search's cache directory ($EDGERUN_CACHE_DIR, else
~/.cache/edgerun) in `conversions/<kind>/`, least recently used evicted past MAX_BYTES. A cache that cannot
be written is skipped: the conversion goes to a temporary folder as if there were no cache.

Use (what a backend's compile calls):

    key = conversion_key(model, external, "mnn", MNN.version(), *converter_args)
    with converted_file("mnn", key, lambda target: convert_to(subgraph, target), ".mnn") as path:
        runner = SessionRunner(path, ...)   # read the file inside the block
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgerun.errors import EdgerunError

CACHE_ENV = "EDGERUN_CACHE_DIR"
MAX_BYTES = 2 << 30  # per kind; ResNet-50's .mnn is about 100 MB


def cache_dir() -> Path:
    """The root of edgerun's on-disk caches (calibration, tuned placements, conversions)."""
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "edgerun"


def conversion_key(model: Any, external: Mapping[str, np.ndarray], *salt: str) -> str:
    """A content hash of an ONNX ModelProto (weights inside it or as placeholders), the arrays handed
    alongside it (name -> array, as build_model returns them) and `salt` strings."""
    h = hashlib.blake2b(digest_size=20)
    for part in salt:
        h.update(part.encode())
        h.update(b"\0")
    h.update(model.SerializeToString(deterministic=True))
    for name in sorted(external):
        array = np.ascontiguousarray(external[name])
        h.update(f"{name}:{array.dtype.str}:{array.shape};".encode())
        h.update(array.reshape(-1).view(np.uint8).data)
    return h.hexdigest()


@contextlib.contextmanager
def converted_file(kind: str, key: str, convert: Callable[[Path], None], suffix: str = "") -> Iterator[Path]:
    """The file `convert(target)` makes for `key`: from the cache when it is there, else converted now and
    kept. Valid inside the `with` block only (it may be a temporary file, or evicted later)."""
    if not key or not kind.isidentifier():
        raise EdgerunError(f"a conversion needs a key and a plain kind name, got kind {kind!r} key {key!r}")
    folder = cache_dir() / "conversions" / kind
    path = folder / f"{key}{suffix}"
    cached: Path | None
    try:
        if path.is_file() and path.stat().st_size > 0:
            os.utime(path)  # used now: evicted last
            cached = path
        else:
            cached = _convert_into(folder, path, convert, kind, suffix)
    except OSError:  # no cache here (read-only home, full disk): convert as if there were none
        cached = None
    if cached is not None:
        yield cached
        return
    with tempfile.TemporaryDirectory(prefix="edgerun-convert-") as tmp:
        yield _converted(Path(tmp), convert, kind, suffix)


def _convert_into(folder: Path, path: Path, convert: Callable[[Path], None], kind: str, suffix: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".converting-") as tmp:
        # Renamed into place: a concurrent load sees no file or the whole of it, never half.
        os.replace(_converted(Path(tmp), convert, kind, suffix), path)
    _evict(folder, MAX_BYTES, keep=path)
    return path


def _converted(folder: Path, convert: Callable[[Path], None], kind: str, suffix: str) -> Path:
    target = folder / f"converted{suffix}"
    convert(target)
    if not target.is_file() or target.stat().st_size == 0:
        raise EdgerunError(f"the {kind} conversion wrote nothing")
    return target


def _evict(folder: Path, max_bytes: int, keep: Path) -> None:
    """Delete the least recently used files of `folder` until it holds at most `max_bytes` (never `keep`)."""
    try:
        files = sorted((f.stat().st_mtime, f.stat().st_size, f) for f in folder.iterdir()
                       if f.is_file() and f != keep)
        total = sum(size for _, size, _ in files) + keep.stat().st_size
        for _, size, f in files:
            if total <= max_bytes:
                break
            f.unlink(missing_ok=True)
            total -= size
    except OSError:
        pass  # another process evicting at the same time: the cache stays roughly bounded
