"""Downloading, verifying and atomically activating task versions on the device.

Layout under STATE/:
    blobs/<sha256>                 verified files, shared between versions (content-addressed)
    partial/<sha256>.part          an interrupted download; resumed with an HTTP Range request
    tasks/<task>/<version>/        a complete version: its files plus release.json (the signed manifest)
    tasks/<task>/current           symlink to the active version; replaced with one rename(2)
A version folder is built as `<version>.staging`, fsynced, then renamed, so after `kill -9` a version
folder is either complete or absent, and `current` names the old version or the new one, never half.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from edgerun.fleet.errors import IntegrityError

CHUNK = 1 << 16
# fetch(digest, offset) yields the blob's bytes from `offset` on (the HTTP layer sends a Range header).
Fetch = Callable[[str, int], Iterator[bytes]]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _hash_file(path: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


class Installer:
    def __init__(self, state_dir: str | Path) -> None:
        self.root = Path(state_dir)
        self.blobs = self.root / "blobs"
        self.partial = self.root / "partial"
        self.tasks = self.root / "tasks"
        # Blobs and partial downloads are the agent's alone; task folders are traversable (not listable), so
        # a run under its own uid can read its files where no private mount view hides the rest (rlimit levels).
        for d, mode in ((self.root, 0o711), (self.blobs, 0o700), (self.partial, 0o700), (self.tasks, 0o711)):
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, mode)

    # ---- startup recovery ---------------------------------------------------------------------------
    def recover(self) -> None:
        """Remove what a crash can leave behind; partial downloads stay, to be resumed."""
        for task_dir in self.tasks.iterdir():
            for entry in task_dir.iterdir():
                if entry.name.endswith(".staging"):
                    shutil.rmtree(entry, ignore_errors=True)
                elif entry.name.startswith("current.tmp"):
                    entry.unlink(missing_ok=True)

    # ---- download -----------------------------------------------------------------------------------
    def fetch_blob(self, digest: str, length: int, fetch: Fetch) -> Path:
        """Make blobs/<digest> exist and match; resume a partial download; never keep a bad file."""
        final = self.blobs / digest
        if final.exists():
            if _hash_file(final) == (length, digest):
                return final
            final.unlink()  # a cached blob that changed on disk is never used again; fetch it anew
        part = self.partial / f"{digest}.part"
        offset = part.stat().st_size if part.exists() else 0
        if offset > length:
            part.unlink()
            offset = 0
        if offset < length:
            with open(part, "ab") as f:
                for chunk in fetch(digest, offset):
                    f.write(chunk)
                    if f.tell() > length:
                        break
                f.flush()
                os.fsync(f.fileno())
        h = hashlib.sha256()
        with open(part, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
        size = part.stat().st_size
        if size != length or h.hexdigest() != digest:
            part.unlink()
            raise IntegrityError(f"blob {digest[:12]}…: got {size} bytes hashing to {h.hexdigest()[:12]}…, "
                                 f"manifest says {length} bytes")
        os.replace(part, final)
        return final

    # ---- activation ---------------------------------------------------------------------------------
    def version_dir(self, task: str, version: int) -> Path:
        return self.tasks / task / str(version)

    def build_version(self, manifest: dict[str, Any], envelope: dict[str, Any]) -> Path:
        """Assemble a complete version folder from verified blobs (idempotent)."""
        task, version = manifest["task"], int(manifest["version"])
        final = self.version_dir(task, version)
        if final.exists():
            return final
        staging = final.with_name(f"{version}.staging")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for f in manifest["files"]:
            target = staging / f["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self.blobs / f["sha256"], target)
            if _hash_file(target) != (int(f["length"]), f["sha256"]):
                shutil.rmtree(staging, ignore_errors=True)
                raise IntegrityError(f"blob {f['sha256'][:12]}… for {f['path']} changed on disk since it was verified")
            os.chmod(target, 0o444)
        for sub in [staging, *(p for p in staging.rglob("*") if p.is_dir())]:
            os.chmod(sub, 0o755)  # readable by the run's own uid, whatever the agent's umask
        with open(staging / "release.json", "w") as out:
            json.dump(envelope, out)
            out.flush()
            os.fsync(out.fileno())
        _fsync_dir(staging)
        os.rename(staging, final)
        _fsync_dir(final.parent)
        return final

    def verify_version(self, folder: Path) -> dict[str, Any]:
        """Re-check a version folder against its signed manifest before a run: exactly the manifest's files,
        regular, with their lengths and SHA-256; returns the manifest. Raises IntegrityError otherwise."""
        manifest = json.loads((folder / "release.json").read_text())["signed"]
        expected = {f["path"]: f for f in manifest["files"]}
        seen: set[str] = set()
        for dirpath, dirnames, filenames in os.walk(folder):
            for name in dirnames + filenames:
                path = Path(dirpath) / name
                rel = path.relative_to(folder).as_posix()
                if path.is_symlink() or not (path.is_dir() or path.is_file()):
                    raise IntegrityError(f"{folder.name}: {rel} is not a plain file or folder")
                if path.is_file() and rel != "release.json":
                    if rel not in expected:
                        raise IntegrityError(f"{folder.name}: {rel} is not in the signed manifest")
                    f = expected[rel]
                    if _hash_file(path) != (int(f["length"]), f["sha256"]):
                        raise IntegrityError(f"{folder.name}: {rel} does not match its signed digest")
                    seen.add(rel)
        missing = sorted(set(expected) - seen)
        if missing:
            raise IntegrityError(f"{folder.name}: {missing[0]} is missing")
        return dict(manifest)

    def remove_version(self, task: str, version: int) -> None:
        """Drop a version folder that failed verification; the next check-in builds it again."""
        shutil.rmtree(self.version_dir(task, version), ignore_errors=True)

    def activate(self, task: str, version: int) -> None:
        """Point tasks/<task>/current at <version> with one atomic rename."""
        link = self.tasks / task / "current"
        tmp = link.with_name(f"current.tmp{os.getpid()}")
        tmp.unlink(missing_ok=True)
        os.symlink(str(version), tmp)
        os.replace(tmp, link)
        _fsync_dir(link.parent)

    def deactivate(self, task: str) -> None:
        link = self.tasks / task / "current"
        link.unlink(missing_ok=True)
        if link.parent.exists():
            _fsync_dir(link.parent)

    def active(self) -> dict[str, tuple[int, Path]]:
        """task → (version, folder) for every task whose `current` link names a complete version."""
        out: dict[str, tuple[int, Path]] = {}
        for task_dir in sorted(self.tasks.iterdir()):
            link = task_dir / "current"
            if link.is_symlink():
                target = task_dir / os.readlink(link)
                if (target / "release.json").exists():
                    out[task_dir.name] = (int(target.name), target)
        return out

    def prune(self, task: str, keep: set[int]) -> None:
        """Drop old version folders (blobs stay, as a rollback usually points back at them)."""
        task_dir = self.tasks / task
        for entry in task_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink() and entry.name.isdigit() and int(entry.name) not in keep:
                shutil.rmtree(entry, ignore_errors=True)
