"""The content-addressed store on an S3-compatible object store (AWS S3, MinIO, Ceph RGW, moto, ...).

Objects are named PREFIX/ab/abcdef… exactly as the folder store names files, so a bucket can be filled by
copying a store folder. Several server processes may share one bucket: an object is immutable once
written (its name is its SHA-256) and S3 makes a PUT visible whole or not at all, so there is nothing to lock.

Ranges are proxied, not redirected: the server answers `Range` requests with S3's own ranged GET. Devices
keep one endpoint, one token and one TLS trust anchor, the bucket can stay private (no presigned URLs
that leak, expire mid-download, or need devices to reach the S3 endpoint), and the resumable-download
protocol is unchanged. The price is that bytes flow through the server; docs/fleet.md says what is left.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from edgerun.fleet.errors import FleetError, IntegrityError
from edgerun.fleet.package import sha256_hex
from edgerun.fleet.store import check_digest

CHUNK = 1 << 16


@dataclass(frozen=True)
class S3Options:
    """Connection settings; an empty field falls back to boto3's own chain (AWS_ENDPOINT_URL,
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, ~/.aws, instance roles). No secret key
    field: the server's settings come from its command line, and `ps` shows that to every user."""

    endpoint_url: str = ""
    region: str = ""
    access_key_id: str = ""


def parse_s3_spec(spec: str) -> tuple[str, str]:
    """`s3://bucket/some/prefix` → (bucket, "some/prefix")."""
    url = urlparse(spec)
    if url.scheme != "s3" or not url.netloc:
        raise FleetError(f"not an S3 store {spec!r}: expected s3://bucket[/prefix]")
    return url.netloc, url.path.strip("/")


class S3BlobStore:
    def __init__(self, spec: str, options: S3Options | None = None) -> None:
        try:
            import boto3  # imported here: only a server configured for S3 needs it
            from botocore.config import Config
        except ImportError as exc:
            raise FleetError("an s3:// store needs boto3 (pip install boto3)") from exc
        opts = options or S3Options()
        self.bucket, self.prefix = parse_s3_spec(spec)
        kwargs: dict[str, Any] = {"config": Config(retries={"max_attempts": 5, "mode": "standard"})}
        if opts.endpoint_url or os.environ.get("AWS_ENDPOINT_URL"):
            kwargs["endpoint_url"] = opts.endpoint_url or os.environ["AWS_ENDPOINT_URL"]
        if opts.region:
            kwargs["region_name"] = opts.region
        elif not os.environ.get("AWS_DEFAULT_REGION") and not os.environ.get("AWS_REGION"):
            kwargs["region_name"] = "us-east-1"  # S3-compatible servers ignore it, but botocore wants one
        if opts.access_key_id:  # boto3 pairs an explicit key id only with an explicit secret
            secret = os.environ.get("AWS_SECRET_ACCESS_KEY", "")
            if not secret:
                raise FleetError("an S3 access key id was given but no secret key: set $AWS_SECRET_ACCESS_KEY "
                                 "(the secret is never a command-line argument)")
            kwargs["aws_access_key_id"] = opts.access_key_id
            kwargs["aws_secret_access_key"] = secret
        self.client = boto3.client("s3", **kwargs)
        self._errors = self.client.exceptions.ClientError
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:  # fail at start, with the cause, not on the first device download
            raise FleetError(f"cannot reach S3 bucket {self.bucket!r}: {exc}") from exc

    def ready(self) -> None:
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            raise FleetError(f"cannot reach S3 bucket {self.bucket!r}: {exc}") from exc

    def key(self, digest: str) -> str:
        check_digest(digest)
        return f"{self.prefix}/{digest[:2]}/{digest}" if self.prefix else f"{digest[:2]}/{digest}"

    def _head(self, digest: str) -> dict[str, Any] | None:
        try:
            return dict(self.client.head_object(Bucket=self.bucket, Key=self.key(digest)))
        except self._errors as exc:
            if str(exc.response.get("Error", {}).get("Code")) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise

    def put(self, digest: str, data: bytes) -> None:
        if sha256_hex(data) != check_digest(digest):
            raise IntegrityError(f"upload does not hash to {digest}")
        if self._head(digest) is not None:
            return
        # S3 checks the SHA-256 again on arrival, so a body corrupted between here and the bucket is refused.
        checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
        self.client.put_object(Bucket=self.bucket, Key=self.key(digest), Body=data,
                               ChecksumAlgorithm="SHA256", ChecksumSHA256=checksum)

    def exists(self, digest: str) -> bool:
        return self._head(digest) is not None

    def size(self, digest: str) -> int | None:
        head = self._head(digest)
        return None if head is None else int(head["ContentLength"])

    def get(self, digest: str) -> bytes:
        """The whole blob, checked: the server itself (simulation) must not run a tampered object."""
        try:
            data: bytes = self.client.get_object(Bucket=self.bucket, Key=self.key(digest))["Body"].read()
        except self._errors as exc:
            raise FleetError(f"no blob {digest}: {exc}") from exc
        if sha256_hex(data) != digest:
            raise IntegrityError(f"stored object {self.key(digest)} does not hash to its name")
        return data

    def read_range(self, digest: str, start: int, end: int) -> Iterator[bytes]:
        """Bytes start..end (inclusive) with S3's own ranged GET. Not hashed here: the device verifies the
        whole file, and a ranged read cannot be checked on its own."""
        body = self.client.get_object(Bucket=self.bucket, Key=self.key(digest), Range=f"bytes={start}-{end}")["Body"]
        try:
            yield from body.iter_chunks(CHUNK)
        finally:
            body.close()

    def local_path(self, digest: str) -> Path | None:
        return None
