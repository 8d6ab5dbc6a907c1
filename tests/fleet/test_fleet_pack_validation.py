"""task.json schema, `task pack` and package reading against the crash-loop inputs of issue #17."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import pytest

from edgerun.fleet.errors import FleetError
from edgerun.fleet.manifest import (
    release_manifest,
    rollback_manifest,
    validate_release_manifest,
    validate_task_config,
)
from edgerun.fleet.package import pack_task, read_package


def folder(tmp_path: Path, config: object, raw: str | None = None) -> Path:
    d = tmp_path / "task"
    d.mkdir(exist_ok=True)
    (d / "task.json").write_text(raw if raw is not None else json.dumps(config))
    (d / "main.py").write_text("def run(inputs):\n    return 1\n")
    return d


@pytest.mark.parametrize(("extra", "needle"), [
    ({"schedule": "every minute"}, "schedule must be an object, got 'every minute'"),
    ({"schedule": {"every_s": -1}}, "schedule.every_s must be"),
    ({"limits": {"timeout_s": "nan"}}, "limits.timeout_s must be a number"),
    ({"limits": {"memory_mb": 1e9}}, "limits.memory_mb must be an integer"),
    ({"limits": {"memory_mb": 10**9}}, "limits.memory_mb must be a finite number in [16, 65536]"),
    ({"limits": {"processes": True}}, "limits.processes must be"),
    ({"limits": {"timeout": 5}}, "limits has unknown key(s) ['timeout']"),
    ({"network": "yes"}, "network must be true or false"),
    ({"min_isolation": "vm"}, "min_isolation must be one of"),
    ({"entry": "../../etc/passwd.py"}, "entry must be a relative path"),
    ({"version": "2"}, "version must be a positive integer"),
    ({"targeting": {"kind": "everyone"}}, "targeting.kind must be one of"),
    ({"triggers": "page_enter"}, "triggers must be a list"),
])
def test_pack_refuses_bad_fields_naming_them(tmp_path: Path, extra: dict[str, object], needle: str) -> None:
    config = {"name": "t", "version": 1, **extra}
    with pytest.raises(FleetError) as err:
        pack_task(folder(tmp_path, config), tmp_path / "t.tar")
    assert needle in str(err.value)
    # The same function is what the server calls on publish, on the manifest's config.
    with pytest.raises(FleetError):
        validate_task_config(dict(config))


@pytest.mark.parametrize("raw", ['{"name": "t", "version": 1, "limits": {"timeout_s": NaN}}',
                                 '{"name": "t", "version": 1, "limits": {"timeout_s": Infinity}}'])
def test_nan_and_infinity_literals_are_refused(tmp_path: Path, raw: str) -> None:
    with pytest.raises(FleetError, match="is not a number JSON allows"):
        pack_task(folder(tmp_path, None, raw), tmp_path / "t.tar")


def test_deep_task_json_is_a_clear_error_not_a_recursion_error(tmp_path: Path) -> None:
    raw = '{"name": "t", "version": 1, "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(FleetError, match="nested deeper than 32"):
        pack_task(folder(tmp_path, None, raw), tmp_path / "t.tar")


def test_defaults_are_filled_and_the_package_round_trips(tmp_path: Path) -> None:
    pack_task(folder(tmp_path, {"name": "t", "version": 3, "schedule": {"every_s": 0}}), tmp_path / "t.tar")
    pkg = read_package(tmp_path / "t.tar")
    assert pkg.config["limits"] == {"timeout_s": 10.0, "memory_mb": 512, "processes": 32, "open_files": 256,
                                    "scratch_mb": 64}
    assert pkg.config["network"] is False and [f.path for f in pkg.files] == ["main.py"]


def test_pack_refuses_a_symlink_out_of_the_folder_and_special_files(tmp_path: Path) -> None:
    secret = tmp_path / "secret.key"
    secret.write_text("outside")
    d = folder(tmp_path, {"name": "t", "version": 1})
    (d / "model.bin").symlink_to(secret)
    with pytest.raises(FleetError, match="outside the task folder"):
        pack_task(d, tmp_path / "t.tar")
    (d / "model.bin").unlink()
    (d / "inside.py").symlink_to(d / "main.py")  # a link that stays inside is packed as the file it names
    pkg = pack_task(d, tmp_path / "t.tar")
    assert {f.path for f in pkg.files} == {"main.py", "inside.py"}
    os.mkfifo(d / "pipe")  # reading it would hang the packer
    with pytest.raises(FleetError, match="not a regular file"):
        pack_task(d, tmp_path / "t.tar")


def _tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _good_members() -> list[tuple[tarfile.TarInfo, bytes | None]]:
    main = b"def run(i):\n    return 1\n"
    manifest = {"files": [{"path": "main.py", "sha256": hashlib.sha256(main).hexdigest(), "length": len(main)}]}
    return [_file("task.json", json.dumps({"name": "t", "version": 1}).encode()),
            _file("manifest.json", json.dumps(manifest).encode()), _file("files/main.py", main)]


def test_links_and_special_members_in_a_tar_are_clear_errors(tmp_path: Path) -> None:
    assert read_package(_tar(tmp_path / "ok.tar", _good_members())).name == "t"
    for kind in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        link = tarfile.TarInfo("files/main.py")
        link.type, link.linkname = kind, "/etc/passwd"
        members = [*_good_members()[:2], (link, None)]
        with pytest.raises(FleetError, match="is a link"):
            read_package(_tar(tmp_path / f"link{kind!r}.tar", members))
    fifo = tarfile.TarInfo("files/main.py")
    fifo.type = tarfile.FIFOTYPE
    with pytest.raises(FleetError, match="not a regular file"):
        read_package(_tar(tmp_path / "fifo.tar", [*_good_members()[:2], (fifo, None)]))
    with pytest.raises(FleetError, match="appears twice"):
        read_package(_tar(tmp_path / "dup.tar", [*_good_members(), _good_members()[2]]))


def test_a_tar_declaring_100_gib_is_refused_without_reading_it(tmp_path: Path) -> None:
    huge = tarfile.TarInfo("files/main.py")
    huge.size = 100 << 30
    path = tmp_path / "sparse.tar"
    with open(path, "wb") as f:  # the header alone: a sparse file's worth of nothing
        for info, data in _good_members()[:2]:
            f.write(info.tobuf(tarfile.GNU_FORMAT))
            f.write(data + b"\0" * (-len(data) % 512))
        f.write(huge.tobuf(tarfile.GNU_FORMAT))
    with pytest.raises(FleetError, match="declares 107374182400 bytes, above the limit"):
        read_package(path)
    sparse = tarfile.TarInfo("files/main.py")
    sparse.type = tarfile.GNUTYPE_SPARSE
    with pytest.raises(FleetError):
        read_package(_tar(tmp_path / "gnusparse.tar", [*_good_members()[:2], (sparse, None)]))


def test_release_manifest_validation_for_the_server(tmp_path: Path) -> None:
    good = {"_type": "release", "task": "t", "version": 2, "config": {"name": "t", "version": 2},
            "files": [{"path": "main.py", "sha256": "a" * 64, "length": 10}], "removed": False}
    assert validate_release_manifest(json.loads(json.dumps(good)))["task"] == "t"
    bad_config = {**good, "config": {"name": "t", "version": 2, "limits": {"timeout_s": float("nan")}}}
    with pytest.raises(FleetError, match=r"limits\.timeout_s"):
        validate_release_manifest(bad_config)
    for files, needle in (([{"path": "../x", "sha256": "a" * 64, "length": 1}], "unsafe file path"),
                          ([{"path": "m.py", "sha256": "zz", "length": 1}], "sha256 must be"),
                          ([{"path": "m.py", "sha256": "a" * 64, "length": -1}], "length must be")):
        with pytest.raises(FleetError, match=needle):
            validate_release_manifest({**good, "files": files})
    removed = {**good, "config": {"name": "t"}, "files": [], "removed": True}
    assert validate_release_manifest(removed)["removed"] is True


def test_the_rollback_of_a_release_after_a_removal_is_a_removal_the_server_accepts(tmp_path: Path) -> None:
    # A task whose stable release is a removal (its first release was rolled back) gets published again:
    # its rollback must remove the task again, not carry the removal's config as a runnable release.
    src = tmp_path / "t"
    src.mkdir()
    (src / "task.json").write_text(json.dumps({"name": "t", "version": 4, "entry": "main.py"}))
    (src / "main.py").write_text("def run(inputs):\n    return {}\n")
    pack_task(src, tmp_path / "t.tar")
    release = release_manifest(read_package(tmp_path / "t.tar"))
    first = {**release, "version": 2}
    removal = rollback_manifest(first, None)
    assert removal["removed"] and validate_release_manifest(removal) is removal
    rollback = rollback_manifest(release, removal)
    assert rollback["removed"] and rollback["files"] == [] and rollback["version"] == 5
    validate_release_manifest(rollback)
    carried = rollback_manifest(release, release)
    assert not carried["removed"] and carried["config"] == release["config"]
    validate_release_manifest(carried)
