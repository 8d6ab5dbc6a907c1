"""Content-addressed file store: every blob is named by its SHA-256. A local folder by default."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from edgerun.fleet.errors import FleetError, IntegrityError
from edgerun.fleet.package import sha256_hex

if TYPE_CHECKING:
    from edgerun.fleet.s3_store import S3Options

_SHA = re.compile(r"^[0-9a-f]{64}$")


def check_digest(digest: str) -> str:
    if not _SHA.match(digest):
        raise FleetError(f"not a SHA-256 hex digest: {digest!r}")
    return digest


class BlobStore(Protocol):
    def put(self, digest: str, data: bytes) -> None: ...
    def exists(self, digest: str) -> bool: ...
    def get(self, digest: str) -> bytes: ...
    def size(self, digest: str) -> int | None: ...
    def read_range(self, digest: str, start: int, end: int) -> Iterator[bytes]: ...
    def local_path(self, digest: str) -> Path | None: ...
    def ready(self) -> None: ...  # raises FleetError with the cause when the store cannot serve now


class LocalBlobStore:
    """Blobs under ROOT/ab/abcdef…; written to a temp file and renamed, so a reader never sees half a blob."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:
        check_digest(digest)
        return self.root / digest[:2] / digest

    def put(self, digest: str, data: bytes) -> None:
        if sha256_hex(data) != check_digest(digest):
            raise IntegrityError(f"upload does not hash to {digest}")
        path = self._path(digest)
        if path.exists():
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".up-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def exists(self, digest: str) -> bool:
        return self._path(digest).exists()

    def get(self, digest: str) -> bytes:
        try:
            return self._path(digest).read_bytes()
        except FileNotFoundError as exc:
            raise FleetError(f"no blob {digest}") from exc

    def size(self, digest: str) -> int | None:
        p = self._path(digest)
        return p.stat().st_size if p.exists() else None

    def read_range(self, digest: str, start: int, end: int) -> Iterator[bytes]:
        with open(self._path(digest), "rb") as f:
            f.seek(start)
            left = end - start + 1
            while left > 0 and (chunk := f.read(min(left, 1 << 16))):
                left -= len(chunk)
                yield chunk

    def ready(self) -> None:
        if not (self.root.is_dir() and os.access(self.root, os.R_OK | os.W_OK | os.X_OK)):
            raise FleetError(f"blob folder {self.root} is missing or not readable and writable")

    def local_path(self, digest: str) -> Path | None:
        p = self._path(digest)
        return p if p.exists() else None


def open_store(spec: str, data_dir: str | Path, s3: S3Options | None = None) -> BlobStore:
    """`spec` is empty (DATA/blobs), a folder path, or s3://bucket/prefix; several servers may share any."""
    if spec.startswith("s3://"):
        from edgerun.fleet.s3_store import S3BlobStore  # boto3 is needed only by servers that use S3

        return S3BlobStore(spec, s3)
    if "://" in spec:
        raise FleetError(f"unsupported store {spec!r}: use a folder or s3://bucket/prefix")
    return LocalBlobStore(spec or Path(data_dir) / "blobs")
