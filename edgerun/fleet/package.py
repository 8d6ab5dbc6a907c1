"""Task packages: a folder with task.json (config) plus scripts and resources, packed into one tar file.

Every file is named in the package's manifest by path, SHA-256 and length; the release manifest that the
offline release key signs is built from that list, so a device can check each file it downloads.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from edgerun.fleet.errors import FleetError

CONFIG_NAME = "task.json"
MANIFEST_NAME = "manifest.json"
_TASK_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
DEFAULT_LIMITS = {"timeout_s": 10.0, "memory_mb": 512}


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
    """Check task.json and fill defaults; raise FleetError naming the first problem."""
    name = config.get("name")
    if not isinstance(name, str) or not _TASK_NAME.match(name):
        raise FleetError(f"task.json: 'name' must match {_TASK_NAME.pattern}, got {name!r}")
    version = config.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise FleetError(f"task.json: 'version' must be a positive integer, got {version!r}")
    entry = config.setdefault("entry", "main.py")
    if not isinstance(entry, str):
        raise FleetError("task.json: 'entry' must be a path")
    triggers = config.setdefault("triggers", [])
    if not isinstance(triggers, list):
        raise FleetError("task.json: 'triggers' must be a list")
    limits = {**DEFAULT_LIMITS, **config.get("limits", {})}
    if float(limits["timeout_s"]) <= 0 or int(limits["memory_mb"]) <= 0:
        raise FleetError("task.json: limits must be positive")
    config["limits"] = limits
    config.setdefault("targeting", {"kind": "uniform"})
    return config


def _safe_relpath(rel: str) -> str:
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise FleetError(f"unsafe path in package: {rel!r}")
    return str(p)


def pack_task(src_dir: str | Path, out_path: str | Path) -> TaskPackage:
    """Pack a task folder into a tar file; returns the package so callers can print its manifest."""
    src = Path(src_dir)
    cfg_path = src / CONFIG_NAME
    if not cfg_path.is_file():
        raise FleetError(f"{src} has no {CONFIG_NAME}")
    try:
        config = validate_config(json.loads(cfg_path.read_text()))
    except json.JSONDecodeError as exc:
        raise FleetError(f"{cfg_path}: invalid JSON: {exc}") from exc
    files: list[FileEntry] = []
    blobs: dict[str, bytes] = {}
    for path in sorted(p for p in src.rglob("*") if p.is_file()):
        rel = path.relative_to(src).as_posix()
        if rel == CONFIG_NAME or "__pycache__" in rel.split("/"):
            continue
        data = path.read_bytes()
        entry = FileEntry(rel, sha256_hex(data), len(data))
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
        _add_bytes(tar, CONFIG_NAME, json.dumps(package.config, indent=1, sort_keys=True).encode())
        _add_bytes(tar, MANIFEST_NAME, json.dumps(manifest, indent=1).encode())
        for f in package.files:
            _add_bytes(tar, "files/" + f.path, package.blobs[f.sha256])
    tmp.replace(out)


def read_package(path: str | Path) -> TaskPackage:
    """Read a package and check every file against the package manifest."""
    try:
        tar = tarfile.open(path, "r")  # noqa: SIM115 - closed by the `with tar` below
    except (OSError, tarfile.TarError) as exc:
        raise FleetError(f"cannot read package {path}: {exc}") from exc
    with tar:
        def member(name: str) -> bytes:
            f = tar.extractfile(name)
            if f is None:
                raise FleetError(f"package {path} lacks {name}")
            return f.read()

        try:
            config = validate_config(json.loads(member(CONFIG_NAME)))
            manifest = json.loads(member(MANIFEST_NAME))
        except KeyError as exc:
            raise FleetError(f"package {path} is incomplete: {exc}") from exc
        files, blobs = [], {}
        for item in manifest["files"]:
            entry = FileEntry(_safe_relpath(item["path"]), item["sha256"], int(item["length"]))
            data = member("files/" + entry.path)
            if len(data) != entry.length or sha256_hex(data) != entry.sha256:
                raise FleetError(f"package {path}: {entry.path} does not match its manifest")
            files.append(entry)
            blobs[entry.sha256] = data
    return TaskPackage(config, files, blobs)
