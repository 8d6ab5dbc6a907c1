"""CURVE key files for the remote runtime: make them, read them, refuse secrets that others can read.

A key pair is two files, in the ZPL certificate format libzmq's tools and `zmq.auth` also read:
`NAME.key` (public, shareable) and `NAME.key_secret` (public and secret, mode 0600). Keys never travel in
argv: the server and clients take file paths (or environment variables naming files).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import zmq
from zmq.utils import z85

from edgerun.errors import EdgerunError

PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"
_FIELD = re.compile(r'^\s*(public-key|secret-key)\s*=\s*"([^"]{40})"\s*$', re.M)
_BARE = re.compile(r"^\s*([0-9A-Za-z.:+=^!/*?&<>()\[\]{}@%$#-]{40})\s*$")


class KeyFileError(EdgerunError):
    """A key file that is missing, malformed, or readable by others."""


@dataclass(frozen=True)
class KeyPair:
    public: bytes  # z85, 40 bytes
    secret: bytes  # z85, 40 bytes


def _z85_ok(key: bytes) -> bool:
    try:
        return len(key) == 40 and len(z85.decode(key)) == 32
    except (ValueError, KeyError, TypeError):
        return False


def _write(path: Path, text: str, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)  # the umask may have narrowed it; never widened


def init_keys(folder: str | os.PathLike[str], name: str) -> tuple[Path, Path]:
    """Make a key pair in `folder` (created 0700 if missing): NAME.key (0644) and NAME.key_secret (0600).

    Refuses to overwrite existing files: a server's key pair is its identity to every client."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name) or name.startswith("."):
        raise KeyFileError(f"key name {name!r}: use 1 to 64 letters, digits, '_', '-' or '.'")
    d = Path(folder)
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    public, secret = zmq.curve_keypair()
    pub_path, sec_path = d / f"{name}{PUBLIC_SUFFIX}", d / f"{name}{SECRET_SUFFIX}"
    for p in (pub_path, sec_path):
        if p.exists():
            raise KeyFileError(f"{p} already exists; remove it first to make a new key pair")
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    head = f"#   ****  edgerun CURVE key {name!r}, made {stamp}  ****\n#   ZeroMQ CURVE, ZPL format\n\nmetadata\ncurve\n"
    _write(sec_path, head + f'    public-key = "{public.decode()}"\n    secret-key = "{secret.decode()}"\n', 0o600)
    _write(pub_path, head + f'    public-key = "{public.decode()}"\n', 0o644)
    return pub_path, sec_path


def _read(path: str | os.PathLike[str]) -> str:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise KeyFileError(f"cannot read the key file {path}: {getattr(exc, 'strerror', None) or exc}") from None


def read_public_key(path: str | os.PathLike[str]) -> bytes:
    """The z85 public key in a NAME.key file (or in a secret file, or a file holding just the 40 characters)."""
    text = _read(path)
    fields = dict(_FIELD.findall(text))
    bare = _BARE.match(text)
    key = (fields.get("public-key") or (bare.group(1) if bare else "")).encode()
    if not _z85_ok(key):
        raise KeyFileError(f"{path} holds no CURVE public key (make one with `edgerun remote keys init`)")
    return key


def read_key_pair(path: str | os.PathLike[str]) -> KeyPair:
    """A NAME.key_secret file: refused when group or others may read it (like ssh's private keys)."""
    mode = _mode(path)
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"the secret key file {path} is accessible by others (mode {mode & 0o777:04o}); "
                           f"run: chmod 600 {path}")
    fields = dict(_FIELD.findall(_read(path)))
    public, secret = fields.get("public-key", "").encode(), fields.get("secret-key", "").encode()
    if not (_z85_ok(public) and _z85_ok(secret)):
        raise KeyFileError(f"{path} is not a CURVE secret key file (make one with `edgerun remote keys init`)")
    if zmq.curve_public(secret) != public:
        raise KeyFileError(f"{path}: the public key does not belong to the secret key")
    return KeyPair(public, secret)


def _mode(path: str | os.PathLike[str]) -> int:
    try:
        return os.stat(path).st_mode
    except OSError as exc:
        raise KeyFileError(f"cannot read the key file {path}: {exc.strerror}") from None


def read_allowed_keys(paths: Iterable[str | os.PathLike[str]]) -> set[bytes]:
    """Client public keys from files, or from every NAME.key in a folder."""
    keys: set[bytes] = set()
    for p in paths:
        path = Path(p)
        if path.is_dir():
            files = sorted(path.glob(f"*{PUBLIC_SUFFIX}"))
            if not files:
                raise KeyFileError(f"the folder {path} holds no *{PUBLIC_SUFFIX} public key files")
            keys.update(read_public_key(f) for f in files)
        else:
            keys.add(read_public_key(path))
    return keys
