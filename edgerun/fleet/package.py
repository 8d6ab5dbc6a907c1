"""Task packages: a folder with task.json (config) plus scripts and resources, packed into one tar file.

Every file is named in the package's manifest by path, SHA-256 and length; the release manifest that the
offline release key signs is built from that list, so a device can check each file it downloads.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from edgerun.fleet.errors import FleetError
from edgerun.fleet.task_schema import (
    MAX_CONFIG_BYTES,
    config_to_json,
    parse_config_json,
    validate_task_config,
)

CONFIG_NAME = "task.json"
MANIFEST_NAME = "manifest.json"
MAX_FILE_BYTES = 2 << 30  # one file of a package (a model's weights)
MAX_PACKAGE_BYTES = 4 << 30  # all files of a package together


@dataclass(frozen=True)
class FileEntry:
    path: str
    sha256: str
    length: int

    def as_dict(self) -> dict[str, Any]:
        return {"path": self.path, "sha256": self.sha256, "length": self.length}


@dataclass
class TaskPackage:
    """A packed task read into memory: its config, its file list and the bytes of every file."""

    config: dict[str, Any]
    files: list[FileEntry]
    blobs: dict[str, bytes]

    @property
    def name(self) -> str:
        return str(self.config["name"])

    @property
    def version(self) -> int:
        return int(self.config["version"])


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Check task.json and fill defaults; raise FleetError naming the first bad field (task_schema.py)."""
    return validate_task_config(config)


def _safe_relpath(rel: Any) -> str:
    if not isinstance(rel, str):
        raise FleetError(f"unsafe path in package: {rel!r}")
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts or "\x00" in rel:
        raise FleetError(f"unsafe path in package: {rel!r}")
    return str(p)


def _task_files(src: Path) -> list[Path]:
    """Regular files under `src`; a link is followed only if it stays inside, anything else is refused."""
    root = src.resolve()
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(src).as_posix()
            if name == "__pycache__" or rel == CONFIG_NAME:
                continue
            if path.is_symlink():
                target = path.resolve()
                if target != root and root not in target.parents:
                    raise FleetError(f"{rel} is a link to {target}, outside the task folder; copy the file in")
                if target.is_dir():
                    raise FleetError(f"{rel} is a link to a folder; packages hold plain files and folders only")
            mode = path.stat().st_mode
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise FleetError(f"{rel} is not a regular file (a pipe, socket or device); packages hold files")
            found.append(path)
    return sorted(found)


def pack_task(src_dir: str | Path, out_path: str | Path) -> TaskPackage:
    """Pack a task folder into a tar file; returns the package so callers can print its manifest."""
    src = Path(src_dir)
    cfg_path = src / CONFIG_NAME
    if cfg_path.is_symlink() or not cfg_path.is_file():
        raise FleetError(f"{src} has no {CONFIG_NAME} (a plain file)")
    config = validate_config(parse_config_json(cfg_path.read_bytes(), str(cfg_path)))
    files: list[FileEntry] = []
    blobs: dict[str, bytes] = {}
    for path in _task_files(src):
        data = path.read_bytes()
        entry = FileEntry(_safe_relpath(path.relative_to(src).as_posix()), sha256_hex(data), len(data))
        files.append(entry)
        blobs[entry.sha256] = data
    if config["entry"] not in {f.path for f in files}:
        raise FleetError(f"entry script {config['entry']!r} is not in {src}")
    package = TaskPackage(config, files, blobs)
    _write_tar(package, Path(out_path))
    return package


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0  # reproducible packages: same inputs, same bytes
    tar.addfile(info, io.BytesIO(data))


def _write_tar(package: TaskPackage, out: Path) -> None:
    manifest = {"files": [f.as_dict() for f in package.files]}
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w") as tar:
        _add_bytes(tar, CONFIG_NAME, config_to_json(package.config).encode())
        _add_bytes(tar, MANIFEST_NAME, json.dumps(manifest, indent=1).encode())
        for f in package.files:
            _add_bytes(tar, "files/" + f.path, package.blobs[f.sha256])
    tmp.replace(out)


def read_package(path: str | Path, *, max_file_bytes: int = MAX_FILE_BYTES,
                 max_total_bytes: int = MAX_PACKAGE_BYTES) -> TaskPackage:
    """Read a package and check every file against the package manifest.

    Only regular members are read, each no larger than its declared length and the limits (checked on the
    header, before reading, so a sparse member declaring 100 GiB costs nothing); links, devices, sparse and
    duplicate members, unsafe paths and deep or non-finite JSON are refused with a FleetError.
    """
    try:
        tar = tarfile.open(path, "r:")  # noqa: SIM115 - closed by the `with tar` below
    except (OSError, tarfile.TarError) as exc:
        raise FleetError(f"cannot read package {path}: {exc}") from exc
    with tar:
        try:
            members = _check_members(tar, path, max_file_bytes, max_total_bytes)
        except tarfile.TarError as exc:
            raise FleetError(f"package {path} is not a readable tar: {exc}") from exc

        def member(name: str, limit: int) -> bytes:
            info = members.get(name)
            if info is None:
                raise FleetError(f"package {path} lacks {name}")
            if info.size > limit:
                raise FleetError(f"package {path}: {name} declares {info.size} bytes, above the limit of {limit}")
            f = tar.extractfile(info)
            if f is None:
                raise FleetError(f"package {path}: {name} is not a regular file")
            return f.read(limit + 1)

        config = validate_config(parse_config_json(member(CONFIG_NAME, MAX_CONFIG_BYTES), f"{path}: {CONFIG_NAME}"))
        manifest = parse_config_json(member(MANIFEST_NAME, MAX_CONFIG_BYTES), f"{path}: {MANIFEST_NAME}")
        items = manifest.get("files") if isinstance(manifest, dict) else None
        if not isinstance(items, list):
            raise FleetError(f"package {path}: {MANIFEST_NAME} has no 'files' list")
        files, blobs = [], {}
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("sha256"), str) or \
                    isinstance(item.get("length"), bool) or not isinstance(item.get("length"), int):
                raise FleetError(f"package {path}: bad file entry {str(item)[:80]}")
            entry = FileEntry(_safe_relpath(item.get("path")), item["sha256"], item["length"])
            info = members.get("files/" + entry.path)
            if info is not None and info.size != entry.length:
                raise FleetError(f"package {path}: {entry.path} is {info.size} bytes, its manifest says {entry.length}")
            data = member("files/" + entry.path, max_file_bytes)
            if len(data) != entry.length or sha256_hex(data) != entry.sha256:
                raise FleetError(f"package {path}: {entry.path} does not match its manifest")
            files.append(entry)
            blobs[entry.sha256] = data
    return TaskPackage(config, files, blobs)


def _check_members(tar: tarfile.TarFile, path: str | Path, max_file: int, max_total: int) -> dict[str, tarfile.TarInfo]:
    members: dict[str, tarfile.TarInfo] = {}
    total = 0
    for info in tar:
        name = info.name
        if info.issym() or info.islnk():
            raise FleetError(f"package {path}: {name} is a link; packages hold regular files only")
        if not info.isreg():
            raise FleetError(f"package {path}: {name} is not a regular file (type {info.type!r})")
        if info.issparse():
            raise FleetError(f"package {path}: {name} is a sparse member; packages hold plain files only")
        if name in members:
            raise FleetError(f"package {path}: {name} appears twice")
        if info.size > max_file:
            raise FleetError(f"package {path}: {name} declares {info.size} bytes, above the limit of {max_file}")
        total += info.size
        if total > max_total:
            raise FleetError(f"package {path}: members declare more than {max_total} bytes in total")
        members[_safe_relpath(name)] = info
    return members
