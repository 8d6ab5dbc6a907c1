"""Signing, root rotation and manifest checks, without a server."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from fleet_helpers import make_task

from edgerun.fleet.errors import ExpiredError, FleetError, RollbackAttackError, SignatureError
from edgerun.fleet.manifest import sign_assignment, sign_release, verify_assignment, verify_release
from edgerun.fleet.package import pack_task, read_package
from edgerun.fleet.signing import KeyDir, Root, SigningKey, sign_envelope, verify_root_update


def test_release_signed_by_release_key_verifies_and_wrong_key_is_refused(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    root = Root(keys.init())
    pkg = read_package(make_task(tmp_path, "t", 2))
    good, rollback = sign_release(pkg, None, keys.key("release"))
    assert verify_release(root, good)["version"] == 2
    assert verify_release(root, rollback)["removed"] is True
    # The online assignment key is a real key of the root, but not of the release role.
    wrong, _ = sign_release(pkg, None, keys.key("assignment"))
    with pytest.raises(SignatureError):
        verify_release(root, wrong)
    stranger, _ = sign_release(pkg, None, SigningKey.generate())
    with pytest.raises(SignatureError):
        verify_release(root, stranger)


def test_modified_signed_content_is_refused(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    root = Root(keys.init())
    env, _ = sign_release(read_package(make_task(tmp_path, "t", 1)), None, keys.key("release"))
    env["signed"]["files"][0]["sha256"] = "0" * 64
    with pytest.raises(SignatureError):
        verify_release(root, env)


def test_expired_and_lower_versions_are_refused(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    root = Root(keys.init())
    pkg = read_package(make_task(tmp_path, "t", 3))
    expired, _ = sign_release(pkg, None, keys.key("release"), lifetime_s=-1)
    with pytest.raises(ExpiredError):
        verify_release(root, expired)
    fresh, _ = sign_release(pkg, None, keys.key("release"))
    with pytest.raises(RollbackAttackError):
        verify_release(root, fresh, min_version=4)
    a = sign_assignment("dev", 5, {}, keys.key("assignment"))
    with pytest.raises(RollbackAttackError):
        verify_assignment(root, a, device_id="dev", min_serial=6)
    with pytest.raises(SignatureError):
        verify_assignment(root, a, device_id="other-dev")
    with pytest.raises(ExpiredError):
        verify_assignment(root, sign_assignment("dev", 7, {}, keys.key("assignment"), lifetime_s=-1), device_id="dev")


def test_key_rotation_chain(tmp_path: Path) -> None:
    keys = KeyDir(tmp_path / "keys")
    v1 = Root(keys.init())
    old_release = keys.key("release")
    keys.rotate("release")
    keys.rotate("root")
    chain = keys.root_chain()
    assert [c["signed"]["version"] for c in chain] == [1, 2, 3]
    current = v1
    for env in chain[1:]:
        current = verify_root_update(current, env)
    pkg = read_package(make_task(tmp_path, "t", 1))
    with pytest.raises(SignatureError):
        verify_release(current, sign_release(pkg, None, old_release)[0])
    assert verify_release(current, sign_release(pkg, None, keys.key("release"))[0])["version"] == 1
    # Skipping a version, or a root signed only by a new key, is refused.
    with pytest.raises(RollbackAttackError):
        verify_root_update(v1, chain[2])
    forged = dict(chain[1]["signed"])
    with pytest.raises(SignatureError):
        verify_root_update(v1, sign_envelope(forged, [SigningKey.generate()]))


def test_pack_and_read_package_check_every_file(tmp_path: Path) -> None:
    pkg_path = make_task(tmp_path, "t", 1, files={"model/weights.bin": b"\x01" * 1000})
    pkg = read_package(pkg_path)
    assert {f.path for f in pkg.files} == {"main.py", "model/weights.bin"}
    assert all(len(pkg.blobs[f.sha256]) == f.length for f in pkg.files)
    # Repack the tar with one file changed but the manifest unchanged.
    bad = tmp_path / "bad.tar"
    with tarfile.open(pkg_path) as src, tarfile.open(bad, "w") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read()  # type: ignore[union-attr]
            if m.name == "files/model/weights.bin":
                data = b"\x02" * 1000
            import io
            dst.addfile(m, io.BytesIO(data))
    with pytest.raises(FleetError, match="does not match"):
        read_package(bad)


def test_pack_refuses_bad_config(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "task.json").write_text('{"name": "Bad Name", "version": 1}')
    (src / "main.py").write_text("")
    with pytest.raises(FleetError, match="name"):
        pack_task(src, tmp_path / "x.tar")
    (src / "task.json").write_text('{"name": "ok", "version": 0}')
    with pytest.raises(FleetError, match="version"):
        pack_task(src, tmp_path / "x.tar")
