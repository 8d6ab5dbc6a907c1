"""Content-addressed file store: every blob is named by its SHA-256. A local folder by default."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Protocol

from edgerun.fleet.errors import FleetError, IntegrityError
from edgerun.fleet.package import sha256_hex

_SHA = re.compile(r"^[0-9a-f]{64}$")


def check_digest(digest: str) -> str:
    if not _SHA.match(digest):
        raise FleetError(f"not a SHA-256 hex digest: {digest!r}")
    return digest


class BlobStore(Protocol):
    def put(self, digest: str, data: bytes) -> None: ...
    def exists(self, digest: str) -> bool: ...
    def get(self, digest: str) -> bytes: ...
    def local_path(self, digest: str) -> Path | None: ...


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

    def local_path(self, digest: str) -> Path | None:
        p = self._path(digest)
        return p if p.exists() else None


def open_store(spec: str, data_dir: str | Path) -> BlobStore:
    """`spec` is empty (DATA/blobs) or a folder path, which several servers may share."""
    if "://" in spec:
        # An S3-compatible store is planned behind this same BlobStore protocol (docs/fleet.md, "What is left").
        raise FleetError(f"unsupported store {spec!r}: only a local or shared folder is built so far")
    return LocalBlobStore(spec or Path(data_dir) / "blobs")
