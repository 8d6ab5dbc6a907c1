"""Release manifests (signed offline) and device assignments (signed online), built and verified here.

Release manifest, role `release`:
    {"_type": "release", "task", "version", "expires", "config", "files": [{path, sha256, length}],
     "removed": false, "rollback_of": null}
A rollback is a new, higher version that points at the files of the last good release (or is
`removed` when there was none). `task publish` signs it together with the release, so the server can
roll back automatically without ever holding the offline key.

Assignment, role `assignment`:
    {"_type": "assignment", "device_id", "serial", "expires", "tasks": {name: release envelope}}
"""

from __future__ import annotations

import re
from typing import Any

from edgerun.fleet.canonical import iso_after
from edgerun.fleet.errors import FleetError, RollbackAttackError, SignatureError
from edgerun.fleet.package import MAX_FILE_BYTES, TaskPackage
from edgerun.fleet.signing import Root, SigningKey, check_expiry, sign_envelope
from edgerun.fleet.task_schema import check_depth, validate_task_config

__all__ = ["validate_release_manifest", "validate_task_config"]  # the server's checks on publish

RELEASE_LIFETIME_S = 365 * 86400
ASSIGNMENT_LIFETIME_S = 3600


def release_manifest(package: TaskPackage, lifetime_s: float = RELEASE_LIFETIME_S) -> dict[str, Any]:
    config = {k: v for k, v in package.config.items() if k not in ("rollout",)}
    return {"_type": "release", "task": package.name, "version": package.version,
            "expires": iso_after(lifetime_s), "config": config,
            "files": [f.as_dict() for f in package.files], "removed": False, "rollback_of": None}


def rollback_manifest(release: dict[str, Any], previous: dict[str, Any] | None,
                      lifetime_s: float = RELEASE_LIFETIME_S) -> dict[str, Any]:
    """Version+1 of `release` carrying `previous`'s files and config, or removing the task if there is none
    (or `previous` is a removal)."""
    base = {"_type": "release", "task": release["task"], "version": release["version"] + 1,
            "expires": iso_after(lifetime_s), "rollback_of": release["version"]}
    if previous is None or previous.get("removed"):
        # Nothing to go back to (first release, or the stable one is itself a removal): rolling back removes.
        return {**base, "config": {"name": release["task"]}, "files": [], "removed": True}
    return {**base, "config": previous["config"], "files": previous["files"], "removed": False}


def sign_release(package: TaskPackage, previous: dict[str, Any] | None, key: SigningKey,
                 lifetime_s: float = RELEASE_LIFETIME_S) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pair `task publish` uploads: the signed release and its pre-signed rollback."""
    release = release_manifest(package, lifetime_s)
    return sign_envelope(release, [key]), sign_envelope(rollback_manifest(release, previous, lifetime_s), [key])


def verify_release(root: Root, envelope: dict[str, Any], *, task: str | None = None,
                   min_version: int = 0) -> dict[str, Any]:
    """Signature by the release role, not expired, and not below the highest version already seen."""
    signed = root.verify_role(envelope, "release")
    if signed.get("_type") != "release":
        raise SignatureError("not a release manifest")
    if task is not None and signed.get("task") != task:
        raise SignatureError(f"manifest names task {signed.get('task')!r}, expected {task!r}")
    check_expiry(signed, f"release {signed['task']} v{signed['version']}")
    if int(signed["version"]) < min_version:
        raise RollbackAttackError(f"{signed['task']} v{signed['version']} is below v{min_version}, already seen")
    for f in signed["files"]:
        if not isinstance(f.get("sha256"), str) or not isinstance(f.get("length"), int):
            raise FleetError("manifest file entry lacks sha256/length")
    return signed


_SHA256 = re.compile(r"^[0-9a-f]{64}$")
MAX_FILES = 10_000


def validate_release_manifest(signed: Any) -> dict[str, Any]:
    """Check the shape of a release (or rollback) manifest's `signed` part before storing or installing it.

    The server calls this on publish, the agent before install: its config passes `validate_task_config`
    (a removed-task rollback has none to check), and every file entry has a safe relative path, a SHA-256
    hex digest and a length in range. Raises FleetError naming the problem; returns `signed`.
    """
    if not isinstance(signed, dict):
        raise FleetError("release manifest: not an object")
    check_depth(signed, limit=40)
    if not isinstance(signed.get("task"), str) or isinstance(signed.get("version"), bool) or \
            not isinstance(signed.get("version"), int) or signed["version"] < 1:
        raise FleetError("release manifest: 'task' must be a string and 'version' a positive integer")
    files = signed.get("files")
    if not isinstance(files, list) or len(files) > MAX_FILES:
        raise FleetError(f"release manifest: 'files' must be a list of at most {MAX_FILES} entries")
    for f in files:
        if not isinstance(f, dict):
            raise FleetError("release manifest: a file entry is not an object")
        path, digest, length = f.get("path"), f.get("sha256"), f.get("length")
        if not isinstance(path, str) or not path or path.startswith("/") or "\x00" in path or \
                any(part in ("", ".", "..") for part in path.split("/")):
            raise FleetError(f"release manifest: unsafe file path {str(path)[:80]!r}")
        if not isinstance(digest, str) or not _SHA256.match(digest):
            raise FleetError(f"release manifest: {path}: sha256 must be 64 lowercase hex digits")
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= MAX_FILE_BYTES:
            raise FleetError(f"release manifest: {path}: length must be an integer in [0, {MAX_FILE_BYTES}]")
    if signed.get("removed"):
        return signed
    config = signed.get("config")
    if not isinstance(config, dict):
        raise FleetError("release manifest: 'config' must be an object")
    validate_task_config(dict(config))  # a copy: the signed bytes must stay as they were signed
    if config.get("name") != signed["task"]:
        raise FleetError(f"release manifest: config names task {config.get('name')!r}, not {signed['task']!r}")
    return signed


def verify_assignment(root: Root, envelope: dict[str, Any], *, device_id: str,
                      min_serial: int = 0) -> dict[str, Any]:
    return verify_device_metadata(root, envelope, "assignment", device_id=device_id, min_serial=min_serial)


def verify_device_metadata(root: Root, envelope: dict[str, Any], kind: str, *, device_id: str,
                           min_serial: int) -> dict[str, Any]:
    """What the online (assignment) key signs for one device, an assignment or a timestamp: signed by that
    role, of this `kind`, for this device, not expired, and no older than a serial already seen."""
    signed = root.verify_role(envelope, "assignment")
    if signed.get("_type") != kind:
        raise SignatureError(f"not {'an' if kind[0] in 'aeiou' else 'a'} {kind}")
    if signed.get("device_id") != device_id:
        raise SignatureError(f"{kind} is for {signed.get('device_id')!r}, not {device_id!r}")
    check_expiry(signed, f"{kind} #{signed.get('serial')}")
    if int(signed["serial"]) < min_serial:
        raise RollbackAttackError(f"{kind} #{signed['serial']} is older than #{min_serial}, already seen")
    return signed


def sign_assignment(device_id: str, serial: int, tasks: dict[str, dict[str, Any]], key: SigningKey,
                    lifetime_s: float = ASSIGNMENT_LIFETIME_S) -> dict[str, Any]:
    signed = {"_type": "assignment", "device_id": device_id, "serial": serial,
              "expires": iso_after(lifetime_s), "tasks": tasks}
    return sign_envelope(signed, [key])
