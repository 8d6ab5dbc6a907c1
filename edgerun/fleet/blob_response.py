"""HTTP answers for GET /v1/blobs/{sha256} from any store, with single `Range` requests so that a device
resumes an interrupted download instead of starting over. A folder store hands the file to Starlette's
FileResponse; a remote store (S3) gets the same semantics from its own ranged reads."""

from __future__ import annotations

import re

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
