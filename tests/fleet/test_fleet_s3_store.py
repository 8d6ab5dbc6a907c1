"""The S3-compatible store against a real S3 server on loopback (moto's server mode, in a thread): publish,
device download (a resumed one included) and verification through S3; two server processes sharing one
bucket serve the same files; a tampered object is refused by the device."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fleet_helpers import FleetServer, free_port, make_task, start_server

from edgerun.fleet.package import read_package
from edgerun.fleet.signing import KeyDir

boto3 = pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

pytestmark = pytest.mark.xdist_group("fleet-s3")
ALL_AT_ONCE = {"steps": [100], "min_reports": 100}
BUCKET = "fleet-blobs"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture(scope="module")
def s3(s3_endpoint: str) -> Any:
    client = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1",
                          aws_access_key_id="fleet-test", aws_secret_access_key="fleet-test-secret")
    client.create_bucket(Bucket=BUCKET)
    return client


@pytest.fixture(scope="module")
def s3_servers(tmp_path_factory: pytest.TempPathFactory, s3_endpoint: str, s3: Any) -> Iterator[list[FleetServer]]:
    """Two server processes, each with its own SQLite but one bucket: the endpoint comes from a flag,
    the credentials from the standard AWS variables."""
    base = tmp_path_factory.mktemp("fleet-s3")
    keys = KeyDir(base / "keys")
    keys.init()
    mp = pytest.MonkeyPatch()
    mp.setenv("AWS_ACCESS_KEY_ID", "fleet-test")
    mp.setenv("AWS_SECRET_ACCESS_KEY", "fleet-test-secret")
    servers: list[FleetServer] = []
    try:
        for _ in range(2):
            servers.append(start_server(base, keys, "--store", f"s3://{BUCKET}/edge/blobs",
                                        "--s3-endpoint-url", s3_endpoint))
        yield servers
    finally:
        mp.undo()
        for s in servers:
            s.stop()


def _missing(server: FleetServer, digests: list[str]) -> list[str]:
    return list(server.admin()._call("POST", "/v1/admin/blobs/missing", json={"digests": digests})["missing"])


def _digest(pkg: Path, path: str) -> str:
    return next(f.sha256 for f in read_package(pkg).files if f.path == path)


def test_publish_download_resume_and_verify_through_s3(s3_servers: list[FleetServer], s3: Any, tmp_path: Path) -> None:
    server = s3_servers[0]
    blob = bytes(range(256)) * 4096  # 1 MiB
    pkg = make_task(tmp_path, "s3task", 2, files={"weights.bin": blob})
    server.admin().publish(pkg, server.keys, ALL_AT_ONCE)
    digest = _digest(pkg, "weights.bin")
    # The blob lives in the bucket under the prefix, named by its SHA-256, and nowhere on the server's disk.
    obj = s3.get_object(Bucket=BUCKET, Key=f"edge/blobs/{digest[:2]}/{digest}")["Body"].read()
    assert obj == blob
    assert not (server.data / "blobs" / digest[:2] / digest).exists()
    # A ranged request is answered from S3's own ranged GET.
    r = httpx.get(f"{server.url}/v1/blobs/{digest}", headers={"Authorization": "Bearer admin-secret",
                                                             "Range": "bytes=1000-1999"})
    assert r.status_code == 206 and r.headers["content-range"] == f"bytes 1000-1999/{len(blob)}"
    assert r.content == blob[1000:2000]
    r = httpx.get(f"{server.url}/v1/blobs/{digest}", headers={"Authorization": "Bearer admin-secret",
                                                             "Range": f"bytes={len(blob)}-"})
    assert r.status_code == 416
    # A device resumes what a killed download left behind: only the rest is fetched.
    agent = server.agent("s3-resumer", tmp_path / "agent")
    (agent.installer.partial / f"{digest}.part").write_bytes(blob[:300_000])
    served: list[int] = []
    real_fetch = agent._fetch

    def counting_fetch(d: str, offset: int) -> Iterator[bytes]:
        for chunk in real_fetch(d, offset):
            if d == digest:
                served.append(len(chunk))
            yield chunk

    agent._fetch = counting_fetch  # type: ignore[method-assign]
    assert agent.check_in() is True
    assert sum(served) == len(blob) - 300_000
    assert (agent.installer.active()["s3task"][1] / "weights.bin").read_bytes() == blob
    assert agent.run_task("s3task").outcome == "success"


def test_two_servers_sharing_a_bucket_serve_the_same_files(s3_servers: list[FleetServer], tmp_path: Path) -> None:
    a, b = s3_servers
    pkg = make_task(tmp_path, "s3shared", 2, files={"data.bin": b"\x42" * 70_000})
    a.admin().publish(pkg, a.keys, ALL_AT_ONCE)  # uploaded through server A only
    digest = _digest(pkg, "data.bin")
    # Server B has its own database, so it knows nothing of the release, but it serves the bucket's files.
    assert _missing(b, [digest]) == []
    r = httpx.get(f"{b.url}/v1/blobs/{digest}", headers={"Authorization": "Bearer admin-secret"})
    assert r.status_code == 200 and r.content == b"\x42" * 70_000
    missing = "0" * 64
    assert httpx.get(f"{b.url}/v1/blobs/{missing}", headers={"Authorization": "Bearer admin-secret"}).status_code == 404
    # B's own publish of the same files finds them already uploaded and uploads nothing.
    assert _missing(b, [f.sha256 for f in read_package(pkg).files]) == []


def test_tampered_object_in_s3_is_refused_by_the_device(s3_servers: list[FleetServer], s3: Any, tmp_path: Path) -> None:
    server = s3_servers[1]
    pkg = make_task(tmp_path, "s3tamper", 2, files={"model.bin": b"\x07" * 50_000})
    server.admin().publish(pkg, server.keys, ALL_AT_ONCE)
    digest = _digest(pkg, "model.bin")
    key = f"edge/blobs/{digest[:2]}/{digest}"
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"\x08" * 50_000)  # same length: an attacker with bucket access
    agent = server.agent("s3-tamper-dev", tmp_path / "agent")
    assert agent.check_in() is False
    assert any("s3tamper" in e and "manifest says" in e for e in agent.errors)
    assert "s3tamper" not in agent.profile().tasks
    assert not (tmp_path / "agent" / "tasks" / "s3tamper" / "2").exists()
    s3.put_object(Bucket=BUCKET, Key=key, Body=b"\x07" * 50_000)  # repaired: the next check-in installs it
    assert agent.check_in() is True
    assert agent.profile().tasks["s3tamper"] == 2


def test_unreachable_bucket_is_a_clear_error_at_start(s3_endpoint: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    keys = KeyDir(tmp_path / "keys")
    keys.init()
    store = ("--store", "s3://no-such-bucket", "--s3-endpoint-url", s3_endpoint, "--s3-access-key-id", "fleet-test")
    # The secret key is never an argument (`ps` shows arguments): without the variable, a clear refusal.
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY", raising=False)
    with pytest.raises(RuntimeError, match="no secret key: set \\$AWS_SECRET_ACCESS_KEY"):
        start_server(tmp_path, keys, *store)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    with pytest.raises(RuntimeError, match="cannot reach S3 bucket 'no-such-bucket'"):
        start_server(tmp_path, keys, *store)
