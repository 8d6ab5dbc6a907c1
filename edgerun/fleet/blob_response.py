"""HTTP answers for GET /v1/blobs/{sha256} from any store, with single `Range` requests so that a device
resumes an interrupted download instead of starting over. A folder store hands the file to Starlette's
FileResponse; a remote store (S3) gets the same semantics from its own ranged reads.

`SmallBlobs` holds the bytes of small blobs this process served. A blob is named by its SHA-256 and never
changes, so a held copy never goes stale; when a release step goes out, its devices all fetch the same few
files, and each was a file open, a stat and reads through worker threads (FileResponse): about a sixth of
the server's CPU per update in a py-spy profile of `bench/fleet_update_cost.py`."""

from __future__ import annotations

import hashlib
import re
import threading
from collections import OrderedDict

from fastapi import HTTPException
from fastapi.responses import FileResponse, Response, StreamingResponse

from edgerun.fleet.store import BlobStore

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """The inclusive byte span a `Range` header asks for; None means "send the whole file" (no header, a
    multi-range or malformed header, which RFC 9110 lets a server ignore). Raises 416 when unsatisfiable."""
    if not header:
        return None
    m = _RANGE.match(header.strip())
    if m is None or not (m[1] or m[2]):
        return None
    if not m[1]:  # suffix range: the last N bytes
        n = int(m[2])
        if n == 0:
            raise HTTPException(416, "empty suffix range", headers={"Content-Range": f"bytes */{size}"})
        return max(0, size - n), size - 1
    start = int(m[1])
    end = min(int(m[2]), size - 1) if m[2] else size - 1
    if start >= size or end < start:
        raise HTTPException(416, "range not satisfiable", headers={"Content-Range": f"bytes */{size}"})
    return start, end


def blob_response(store: BlobStore, digest: str, range_header: str | None) -> Response:
    path = store.local_path(digest)
    if path is not None:
        return FileResponse(path, media_type="application/octet-stream")  # honours Range itself
    size = store.size(digest)
    if size is None:
        raise HTTPException(404, "no such blob")
    headers = {"Accept-Ranges": "bytes"}
    span = parse_range(range_header, size) if size else None
    if span is None:
        stream = store.read_range(digest, 0, size - 1) if size else iter([b""])
        return StreamingResponse(stream, media_type="application/octet-stream",
                                 headers={**headers, "Content-Length": str(size)})
    start, end = span
    return StreamingResponse(store.read_range(digest, start, end), status_code=206,
                             media_type="application/octet-stream",
                             headers={**headers, "Content-Range": f"bytes {start}-{end}/{size}",
                                      "Content-Length": str(end - start + 1)})


class SmallBlobs:
    """The bytes of blobs up to `max_blob` bytes, `max_total` bytes in all (least recently served out)."""

    def __init__(self, max_blob: int = 256 * 1024, max_total: int = 32 * 1024 * 1024) -> None:
        self.max_blob, self.max_total = max_blob, max_total
        self._held: OrderedDict[str, bytes] = OrderedDict()
        self._total = 0
        self._lock = threading.Lock()

    def get(self, digest: str) -> bytes | None:
        with self._lock:
            data = self._held.get(digest)
            if data is not None:
                self._held.move_to_end(digest)
            return data

    def load(self, store: BlobStore, digest: str) -> bytes | None:
        """Read a small blob from a folder store into the cache (a worker thread's job); None: not held here
        (a remote store, a large blob, no such blob, bytes that do not match their name), so the caller answers through `blob_response`."""
        path = store.local_path(digest)
        if path is None:
            return None
        try:
            if path.stat().st_size > self.max_blob:
                return None
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if hashlib.sha256(data).hexdigest() != digest:  # a damaged store is served as it is, never held: the
            return None                                  # device refuses it, and a repaired file is served next
        with self._lock:
            if digest not in self._held:
                self._held[digest] = data
                self._total += len(data)
                while self._total > self.max_total:
                    _, dropped = self._held.popitem(last=False)
                    self._total -= len(dropped)
        return data


def small_blob_response(data: bytes) -> Response:
    """A whole small blob in one write; the client may still ask for a range (answered by `blob_response`)."""
    return Response(data, media_type="application/octet-stream", headers={"Accept-Ranges": "bytes"})
